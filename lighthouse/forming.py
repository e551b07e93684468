"""The quorum being formed, on the replica that leads: who asked, who was heard, and the requests
waiting for a quorum that includes them (torchft's Lighthouse state, with the issue step given to
the caller: the leader's guarded etcd write).

A request waits for the quorums issued after it asked, in order. One that a quorum leaves out asks
for the next (from then), as in torchft's Lighthouse, but the issue itself puts it back, not its
waiter when it wakes: else a quorum decided before that wake-up would leave it out once more. When
this replica stops leading, every waiting request is told so (``Fenced``) and goes to the new leader.

A request whose caller went away before a quorum included it (the call was cancelled: the client or
the replica that forwarded it died) is withdrawn at once: a quorum formed a moment later must not
name a group that will never hear of it, or its peers wait for it in their first collective. And
when the answer is what got lost (the replica relaying it died after the quorum was issued), the
Manager's retry, the same request again, gets the same quorum: a Manager asks anew only with another
step or commit-failure count, so a request equal to a member of the last quorum is that member's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from .book import Fenced, Issued
from .quorum import Asked, Decision, Rules, decide, next_id

__all__ = ["Forming", "Withdrawn"]

log = logging.getLogger("elastic.lighthouse")

_KEPT = 16  # quorums a slow waiter can still find (torchft's broadcast channel holds as many)


class Withdrawn(Exception):
    """The request's caller went away before a quorum included it."""


class Forming:
    """``issue(issued, new_id)`` makes a quorum official (raises Fenced when this replica may not)."""

    def __init__(
        self,
        rules: Rules,
        previous: Issued | None,
        issue: Callable[[Issued, bool], None],
        *,
        settle_until: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rules = rules
        self.previous = previous
        self._issue = issue
        self._clock = clock
        self._settle_until = settle_until  # a new leader hears the others' heartbeats first
        self._asked: dict[str, tuple[Asked, object]] = {}
        self._heard: dict[str, float] = {}
        self._issued: deque[tuple[int, Issued]] = deque(maxlen=_KEPT)
        self._sequence = 0
        self._fenced: Fenced | None = None
        self._cond = threading.Condition()
        self.reason = "no quorum asked for yet"

    # -- what the service hands over ---------------------------------------------------------------
    def heard(self, replica_id: str, at: float | None = None) -> None:
        with self._cond:
            at = self._clock() if at is None else at
            if at > self._heard.get(replica_id, float("-inf")):
                self._heard[replica_id] = at

    def heartbeats(self) -> dict[str, float]:
        with self._cond:
            return dict(self._heard)

    def quorum(self, member: object, deadline: float, gone: threading.Event | None = None) -> Issued:
        """Wait (until the monotonic ``deadline``) for an issued quorum that includes ``member``.
        TimeoutError when none came; Fenced when this replica stopped leading meanwhile; Withdrawn
        when ``gone`` was set (and ``withdraw(member)`` called) before."""
        rid = member.replica_id
        with self._cond:
            if self.previous is not None and member in self.previous.members:
                return self._again(member)
            self._ask(member)
            seen = self._sequence
            self._tick()
            while True:
                for sequence, issued in list(self._issued):
                    if sequence <= seen:
                        continue
                    seen = sequence
                    if rid in issued.replica_ids:  # (one that left it out put it back among the asked)
                        return issued
                if self._fenced is not None:
                    raise self._fenced
                if gone is not None and gone.is_set():
                    raise Withdrawn(f"the request of {rid} was cancelled")
                left = deadline - self._clock()
                if left <= 0:
                    self._asked.pop(rid, None)
                    raise TimeoutError(f"no quorum including {rid} was formed in time: {self.reason}")
                if not self._cond.wait(min(left, self.rules.quorum_tick)):
                    self._tick()  # a tick's time passed with no news (woken by a quorum: nothing to decide)

    def withdraw(self, member: object) -> None:
        """``member``'s request ended without a quorum: it is no longer among the asked (unless
        the same group asked again meanwhile, with a request of its own)."""
        with self._cond:
            entry = self._asked.get(member.replica_id)
            if entry is not None and entry[1] is member:
                del self._asked[member.replica_id]
                log.info("Quorum request of %s withdrawn: its caller went away", member.replica_id)
            self._cond.notify_all()

    def tick(self) -> None:
        """Form a quorum if one is due (torchft's quorum tick)."""
        with self._cond:
            self._tick()

    def stop(self, why: Fenced) -> None:
        """This replica no longer leads: every waiter is told."""
        with self._cond:
            self._fenced = why
            self._cond.notify_all()

    @property
    def stopped(self) -> Fenced | None:
        """Why this replica may no longer issue quorums (None: it may)."""
        return self._fenced

    def status(self) -> tuple[str, Issued | None]:
        with self._cond:
            return self._decide().reason, self.previous

    # -- inside the lock ---------------------------------------------------------------------------
    def _again(self, member: object) -> Issued:
        """The last quorum for a member of it asking again (its answer was lost), made official again
        as any quorum under the same id is: a replica that may no longer lead raises Fenced here,
        rather than answer from a quorum another leader has since replaced."""
        if self._fenced is not None or not self._official(self.previous, False):
            raise self._fenced
        self.heard(member.replica_id)
        log.info("Quorum %d again for %s: its answer was lost on the way", self.previous.quorum_id, member.replica_id)
        return self.previous

    def _official(self, issued: Issued, new_id: bool) -> bool:
        """Make ``issued`` official (the caller's issue step); False, with every waiter told, when
        this replica may no longer lead."""
        try:
            self._issue(issued, new_id)
            return True
        except Fenced as why:
            self._fenced = why
            self._cond.notify_all()
            return False

    def _previous_ids(self) -> tuple[str, ...] | None:
        return self.previous.replica_ids if self.previous is not None else None

    def _ask(self, member: object) -> None:
        now = self._clock()
        self.heard(member.replica_id, now)  # a request is a heartbeat too (the lock is reentrant)
        asked = Asked(member.replica_id, now, bool(member.shrink_only), int(member.commit_failures))
        self._asked[member.replica_id] = (asked, member)

    def _decide(self) -> Decision:
        now = self._clock()
        asked = {rid: a for rid, (a, _) in self._asked.items()}
        decision = decide(now, asked, self._heard, self._previous_ids(), self.rules)
        if decision.members is not None and not decision.fast and now < self._settle_until:
            return Decision(
                None, f"New leader: hearing the replicas' heartbeats for {self._settle_until - now:.2f} s more"
            )
        return decision

    def _tick(self) -> None:
        if self._fenced is not None or not self._asked:
            return
        decision = self._decide()
        if decision.reason != self.reason:
            log.info("Quorum status: %s", decision.reason)
        self.reason = decision.reason
        if decision.members is None:
            return
        members = tuple(self._asked[rid][1] for rid in decision.members)
        failures = any(m.commit_failures > 0 for m in members)
        previous_id = self.previous.quorum_id if self.previous is not None else 0
        quorum_id = next_id(previous_id, self._previous_ids(), decision.members, failures)
        issued = Issued(quorum_id, members, time.time())
        if not self._official(issued, quorum_id != previous_id):
            return
        if quorum_id != previous_id:
            log.info("Quorum %d: %s", quorum_id, ", ".join(f"{m.replica_id} (step {m.step})" for m in members))
        self.previous = issued
        now = self._clock()
        self._asked = {  # the ones left out ask again for the next quorum, from now
            rid: (replace(asked, joined=now), member)
            for rid, (asked, member) in self._asked.items()
            if rid not in decision.members
        }
        self._sequence += 1
        self._issued.append((self._sequence, issued))
        self._cond.notify_all()
