"""What the probes mean, as pure bookkeeping: the probed node's contact deadline (``ContactLog``)
and the watcher's silence clocks (``Silence``). Both are told the time; neither does I/O."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from .wire import Timing

__all__ = ["ContactLog", "Silence"]


class ContactLog:
    """The probed node's side: when each answer was sent, and which ones its watchers acknowledged.

    ``deadline(round)`` is when this node's workers of that round must be gone unless a newer
    answer is acknowledged: ``fence_after`` after the send time of the newest acknowledged answer
    of the round, or of its first answer while none is. A watcher's silence clock starts no earlier
    than the first answer it received, so this deadline always comes ``timeout - fence_after``
    before any watcher's verdict. None while no answer of the round was sent (nobody watches yet),
    and once a watcher said it stopped watching (``release``): a verdict needs every watcher.
    """

    KEEP = 256  # answers remembered (about 30 s of pings from two watchers)

    def __init__(self, fence_after: float) -> None:
        self.fence_after = fence_after
        self._lock = threading.Lock()
        self._seq = 0
        self._sent: dict[int, tuple[int, float]] = {}  # answer -> (round, send time)
        self._order: deque[int] = deque()
        self._first: dict[int, float] = {}  # round -> its first answer's send time
        self._acked: dict[int, float] = {}  # round -> the send time of its newest acknowledged answer
        self._released: set[int] = set()  # rounds a watcher stopped watching

    def answer(self, round_: int, now: float) -> int:
        """An answer to a ping of ``round_`` is sent now: its number."""
        with self._lock:
            self._seq += 1
            self._sent[self._seq] = (round_, now)
            self._order.append(self._seq)
            if len(self._order) > self.KEEP:
                self._sent.pop(self._order.popleft(), None)
            self._first.setdefault(round_, now)
            return self._seq

    def acknowledged(self, round_: int, seq: int) -> bool:
        """A watcher of ``round_`` received answer ``seq``; True when that moves the deadline."""
        with self._lock:
            entry = self._sent.get(seq)
            if entry is None or entry[0] != round_ or entry[1] <= self._acked.get(round_, float("-inf")):
                return False
            self._acked[round_] = entry[1]
            return True

    def release(self, round_: int) -> None:
        """A watcher of ``round_`` stopped watching, its accusation withdrawn: no verdict can end this
        node's lease for that round any more, so its deadline is off."""
        with self._lock:
            self._released.add(round_)

    def deadline(self, round_: int) -> float | None:
        with self._lock:
            first = self._first.get(round_)
            if first is None or round_ in self._released:
                return None
            return max(first, self._acked.get(round_, first)) + self.fence_after

    def heard_for(self, round_: int, now: float) -> float:
        """Seconds since the send time of the newest acknowledged answer of ``round_`` (or its first)."""
        deadline = self.deadline(round_)
        return 0.0 if deadline is None else now - (deadline - self.fence_after)

    def forget_before(self, round_: int) -> None:
        with self._lock:
            for book in (self._first, self._acked):
                for old in [r for r in book if r < round_]:
                    del book[old]
            self._released = {r for r in self._released if r >= round_}


class Silence:
    """The watcher's side: when each probed peer last answered, and which ones are dead to it.

    A peer is judged only once it answered in this round (an address that never answers is a
    misconfiguration to report, never a reason to end a lease). It is dead to this watcher when its
    machine closed the probe connection (its agent process is gone), or after ``timeout`` seconds
    without an answer. When this watcher's own loop comes late (a starved CPU, a frozen watcher), the
    time it did not look is not counted against anyone.
    """

    def __init__(self, targets: Iterable[str], timing: Timing, now: float) -> None:
        self.timing = timing
        self._heard: dict[str, float | None] = dict.fromkeys(targets)
        self._closed: set[str] = set()
        self._looked = now

    def tick(self, now: float) -> None:
        """This watcher's loop turns; a turn later than one interval past its due time shifts every clock."""
        late = now - self._looked - self.timing.interval
        if late > self.timing.interval:
            for node, heard in self._heard.items():
                if heard is not None:
                    self._heard[node] = heard + late
        self._looked = now

    def heard(self, node: str, now: float) -> None:
        if node in self._heard:
            self._heard[node] = now
            self._closed.discard(node)

    def closed(self, node: str) -> None:
        """The peer's machine closed the connection (or refused a new one)."""
        if self._heard.get(node) is not None:
            self._closed.add(node)

    def ever_heard(self, node: str) -> bool:
        return self._heard.get(node) is not None

    def dead(self, now: float) -> dict[str, str]:
        """The peers dead to this watcher now, each with why."""
        found = {}
        for node, heard in self._heard.items():
            if heard is None:
                continue
            if node in self._closed:
                found[node] = "its agent's probe connection was closed"
            elif now - heard >= self.timing.timeout:
                found[node] = f"no answer to probes for {now - heard:.1f} s"
        return found

    def lagging(self, now: float) -> bool:
        """Some peer missed two answers or closed its connection: a worker failure now may be its loss."""
        return any(
            node in self._closed or (heard is not None and now - heard > 2 * self.timing.interval)
            for node, heard in self._heard.items()
        )

    def answered_since(self, when: float) -> bool:
        """Every probed peer that ever answered in this round answered again after ``when``."""
        return all(
            heard > when and node not in self._closed for node, heard in self._heard.items() if heard is not None
        )
