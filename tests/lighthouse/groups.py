"""Replica groups that step through a lighthouse as torchft's Managers do -- a quorum per step and a
heartbeat every 100 ms, with torchft's own LighthouseClient -- and that fail over to the next
replica when the one they talk to errs or does not answer in time. What each saw is kept for the
test to check: one member set per quorum id, ids that never go back, every step finished."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class Seen:
    step: int
    quorum_id: int
    members: tuple[str, ...]
    at: float  # monotonic, when the answer came


@dataclass
class Group:
    replica_id: str
    addresses: list[str]
    steps: int
    start_at: int = 0  # index of the first replica to talk to
    call_timeout: float = 3.0
    step_time: float = 0.02
    seen: list[Seen] = field(default_factory=list)
    failovers: list[tuple[float, str]] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._index = self.start_at
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._client = self._connect()
        self._threads = [
            threading.Thread(target=self._run, daemon=True, name=f"group-{self.replica_id}"),
            threading.Thread(target=self._beat, daemon=True, name=f"beat-{self.replica_id}"),
        ]

    def _connect(self):
        from torchft._torchft import LighthouseClient

        return LighthouseClient(addr=self.addresses[self._index], connect_timeout=timedelta(seconds=1))

    def _fail_over(self, why: str) -> None:
        with self._lock:
            self._index = (self._index + 1) % len(self.addresses)
            self.failovers.append((time.monotonic(), why))
            for _ in range(len(self.addresses)):
                try:
                    self._client = self._connect()
                    return
                except Exception:  # noqa: BLE001 -- that replica is down too: the next one
                    self._index = (self._index + 1) % len(self.addresses)

    def start(self) -> "Group":
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        try:
            step = 0
            while step < self.steps and not self._stop.is_set():
                try:
                    quorum = self._client.quorum(
                        replica_id=self.replica_id,
                        timeout=timedelta(seconds=self.call_timeout),
                        address=f"manager-{self.replica_id}",
                        store_address=f"store-{self.replica_id}",
                        step=step,
                        world_size=1,
                        shrink_only=False,
                    )
                except Exception as exc:  # noqa: BLE001 -- torchft's client raises plain exceptions
                    self._fail_over(" ".join(str(exc).split())[:120])
                    continue
                members = tuple(sorted(m.replica_id for m in quorum.participants))
                self.seen.append(Seen(step, int(quorum.quorum_id), members, time.monotonic()))
                step += 1
                time.sleep(self.step_time)
        except BaseException as exc:  # noqa: BLE001 -- the test reports it
            self.error = exc
        finally:
            self._stop.set()  # a group that is done stops heartbeating, as a Manager that shuts down

    def _beat(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._client.heartbeat(self.replica_id, timeout=timedelta(seconds=0.5))
            except Exception:  # noqa: BLE001 -- the stepping thread fails over
                pass

    def stop(self) -> None:
        """End the stepping after the step in flight."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        self._threads[0].join(timeout)
        self._stop.set()
        self._threads[1].join(2)
        return not self._threads[0].is_alive()

    @property
    def done(self) -> int:
        return len(self.seen)


def check(groups: list[Group], *, complete: bool = True) -> dict[int, tuple[str, ...]]:
    """Every group finished every step (unless not ``complete``: stopped early), each quorum id has
    one member set, no group saw an id go back, and every quorum a group got includes it. The member
    set of each id."""
    by_id: dict[int, tuple[str, ...]] = {}
    for group in groups:
        assert group.error is None, f"{group.replica_id}: {group.error!r}"
        steps = group.steps if complete else len(group.seen)
        assert [s.step for s in group.seen] == list(range(steps)), f"{group.replica_id} did not finish every step"
        ids = [s.quorum_id for s in group.seen]
        assert ids == sorted(ids), f"{group.replica_id} saw a quorum id go back: {ids}"
        for seen in group.seen:
            assert group.replica_id in seen.members
            known = by_id.setdefault(seen.quorum_id, seen.members)
            assert known == seen.members, f"quorum {seen.quorum_id} issued twice: {known} and {seen.members}"
    return by_id


def same_per_step(groups: list[Group]) -> int:
    """Once every group is in the quorum (they start one by one) and until the first one is done
    (and stops heartbeating), every group saw the same quorum id and members at each step (for runs
    where no group dropped out). The number of steps compared."""
    everyone = len(groups)
    warm = max(next(i for i, s in enumerate(g.seen) if len(s.members) == everyone) for g in groups)
    first_done = min(g.seen[-1].at for g in groups)
    compared = 0
    for step in range(warm, min(g.done for g in groups)):
        if any(g.seen[step].at >= first_done for g in groups):
            break
        views = {(g.seen[step].quorum_id, g.seen[step].members) for g in groups}
        assert len(views) == 1, f"step {step}: the groups saw different quorums {sorted(views)}"
        compared += 1
    return compared
