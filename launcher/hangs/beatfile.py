"""The heartbeat record a worker shares with its agent: one small file per worker, mapped into
memory on both sides, so a heartbeat is a store into shared memory (no system call, no etcd).

The agent creates the file (zeroed, ``SIZE`` bytes) before it starts the worker and names it in
``ELASTIC_HEARTBEAT_FILE``; the worker maps it on its first ``elastic.heartbeat()``. Times are
``time.monotonic()`` seconds: CLOCK_MONOTONIC is one clock for every process of a machine.

    offset  field
    0       magic b"EHB1"
    4       the signal the worker dumps its stacks on (0: none registered)
    8       last heartbeat (double; 0.0: never)
    16      heartbeats so far (uint64)
    24      when the current phase began (double; 0.0: no phase)
    32      the phase's timeout in seconds (double; 0.0: the first-heartbeat timeout)
    40      phase changes so far (uint32): an interval across a change is not a step
    44      the worker's pid (int32)
    48      the phase's name (64 bytes, UTF-8, NUL-padded)
    112     seconds of the rank's own work so far, less its waits for a CPU in it (double: ``elastic.section``,
            ``elastic.watch_ddp``)
    120     own-work spans so far (uint64)

The stacks a worker dumps on request go to ``<record>.stacks`` beside it.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

__all__ = ["ENV", "SIZE", "MAGIC", "BEAT", "PHASE", "WORK", "HEADER", "Beat", "create", "stacks_path", "BeatReader"]

ENV = "ELASTIC_HEARTBEAT_FILE"  # the record's path, in the worker's environment
SIZE = 128
MAGIC = b"EHB1"
HEADER = struct.Struct("<4si")  # magic, stack signal (offset 0)
BEAT = struct.Struct("<dQ")  # last heartbeat, count (offset 8)
PHASE = struct.Struct("<ddIi64s")  # phase start, phase timeout, phase changes, pid, name (offset 24)
WORK = struct.Struct("<dQ")  # own work's seconds, spans (offset 112)
BEAT_AT, PHASE_AT, WORK_AT = 8, 24, 112


@dataclass(frozen=True)
class Beat:
    """One reading of a worker's record."""

    attached: bool  # the worker called the API at least once
    last: float  # monotonic time of the last heartbeat (0.0: never)
    count: int
    phase: str  # "" outside any phase
    phase_started: float
    phase_timeout: float  # 0.0: no timeout of its own
    phase_changes: int
    stack_signal: int
    pid: int
    work: float = 0.0  # seconds of own work timed so far (straggler scores)
    spans: int = 0  # own-work spans timed so far


def stacks_path(record: str) -> str:
    return record + ".stacks"


def create(path: str) -> None:
    """A zeroed record (and an empty stacks file) for a worker about to start."""
    with open(path, "wb") as handle:
        handle.write(bytes(SIZE))
    open(stacks_path(path), "wb").close()


class BeatReader:
    """The agent's side: a read-only map of one worker's record."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def read(self) -> Beat:
        magic, stack_signal = HEADER.unpack_from(self._map, 0)
        last, count = BEAT.unpack_from(self._map, BEAT_AT)
        started, timeout, changes, pid, name = PHASE.unpack_from(self._map, PHASE_AT)
        work, spans = WORK.unpack_from(self._map, WORK_AT)
        return Beat(
            magic == MAGIC,
            last,
            count,
            name.rstrip(b"\0").decode("utf-8", "replace"),
            started,
            timeout,
            changes,
            stack_signal,
            pid,
            work,
            spans,
        )

    def work(self) -> tuple[float, int]:
        """The own-work seconds and spans alone, read until two reads agree (the worker may be writing)."""
        before = WORK.unpack_from(self._map, WORK_AT)
        for _ in range(3):
            now = WORK.unpack_from(self._map, WORK_AT)
            if now == before:
                break
            before = now
        return before

    def close(self) -> None:
        self._map.close()
