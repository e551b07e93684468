"""Worker heartbeats: tell the agent that this rank makes progress, so that a rank that stops is
found, named and restarted long before a collective's own timeout.

    import elastic

    for step, batch in enumerate(loader):
        loss = train_step(batch)
        elastic.heartbeat()                      # once a step: a store into shared memory
        if step % 1000 == 0:
            with elastic.phase("checkpoint", timeout=900):
                save(model)                      # quiet for long, legitimately

Under elastic-run the agent gives each worker a small record mapped into memory
(``launcher/hangs/beatfile.py``): ``heartbeat()`` writes the time and a count there -- no system call
beyond reading the clock (vDSO), no etcd traffic, safe from any thread. Anywhere else (not launched
by elastic-run, or under torchrun) every call does nothing.

On its first call the worker also registers a real-time signal with ``faulthandler``, so the agent
can have every thread's Python stack written to a file beside the record before it stops a hung
rank. A signal the program already handles is never taken.
"""

from __future__ import annotations

import atexit
import faulthandler
import itertools
import math
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from launcher.hangs import beatfile as beats

__all__ = ["heartbeat", "phase", "ENV"]

ENV = beats.ENV
_lock = threading.RLock()


def heartbeat() -> None:
    """This rank is making progress (call it once a step, from any thread)."""
    _beat()


@contextmanager
def phase(name: str, timeout: float | None = None) -> Iterator[None]:
    """A stretch that may be quiet for long (checkpoint, evaluation): judged by its own ``timeout``
    (seconds; None: the first-heartbeat timeout) instead of the learned step time. Phases nest;
    the name shows in the hang report. Usable as a decorator too."""
    if not isinstance(name, str) or not name or len(name.encode()) > 64:
        raise ValueError(f"a phase name is a non-empty string of at most 64 bytes, not {name!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"a phase timeout is a positive number of seconds or None, not {timeout!r}")
    channel = _channel()
    if channel is None:
        yield
        return
    channel.enter(name, float(timeout or 0.0))
    try:
        yield
    finally:
        channel.leave()


class _Channel:
    """This process's mapped record and its phase stack."""

    def __init__(self, buffer: mmap.mmap, stacks) -> None:
        self.buffer = buffer
        self.stacks = stacks  # kept open: faulthandler writes to its descriptor
        self.phases: list[tuple[str, float]] = []
        self.changes = 0
        self.work, self.spans = 0.0, 0  # own work timed so far (``elastic.section``)
        counter = itertools.count(1)
        pack, clock, at = beats.BEAT.pack_into, time.monotonic, beats.BEAT_AT

        def beat() -> None:
            pack(buffer, at, clock(), next(counter))

        self.beat = beat

    def enter(self, name: str, timeout: float) -> None:
        with _lock:
            self.phases.append((name, timeout))
            self._write_phase(name, timeout)

    def leave(self) -> None:
        with _lock:
            self.phases.pop()
            self._write_phase(*(self.phases[-1] if self.phases else ("", 0.0)))

    def worked(self, seconds: float) -> None:
        """One span of the rank's own work took ``seconds`` (straggler scores)."""
        with _lock:
            self.work += seconds
            self.spans += 1
            beats.WORK.pack_into(self.buffer, beats.WORK_AT, self.work, self.spans)

    def _write_phase(self, name: str, timeout: float) -> None:
        self.changes += 1
        started = time.monotonic() if name else 0.0
        beats.PHASE.pack_into(self.buffer, beats.PHASE_AT, started, timeout, self.changes, os.getpid(), name.encode())
        self.beat()


def _noop() -> None:
    pass


_state: dict[str, _Channel | None] = {}


def _channel() -> _Channel | None:
    """The record, mapped on first use; None when there is none to write (not under elastic-run)."""
    with _lock:
        if "channel" not in _state:
            _state["channel"] = _attach(os.environ.get(ENV, ""))
            global _beat
            _beat = _state["channel"].beat if _state["channel"] is not None else _noop
        return _state["channel"]


def _attach_then_beat() -> None:
    _channel()
    _beat()


def _reattach() -> None:
    """Forget the record: the next beat maps the one the environment names now (``elastic.inprocess``
    runs ``train`` again in a new round, with a new record)."""
    global _beat
    with _lock:
        _state.pop("channel", None)
        _beat = _attach_then_beat


_beat: Callable[[], None] = _attach_then_beat


def _attach(path: str) -> _Channel | None:
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            buffer = mmap.mmap(fd, beats.SIZE)
        finally:
            os.close(fd)
        magic, _ = beats.HEADER.unpack_from(buffer, 0)
        owner = beats.PHASE.unpack_from(buffer, beats.PHASE_AT)[3]
        if magic == beats.MAGIC and owner not in (0, os.getpid()):
            return None  # another process of this rank (a data-loader child) attached first: the rank is that one
        stacks = open(beats.stacks_path(path), "ab", buffering=0)
    except (OSError, ValueError) as exc:
        print(f"elastic.heartbeat: no heartbeats for this worker ({path}: {exc})", file=sys.stderr)
        return None
    channel = _Channel(buffer, stacks)
    beats.PHASE.pack_into(buffer, beats.PHASE_AT, 0.0, 0.0, 0, os.getpid(), b"")
    beats.HEADER.pack_into(buffer, 0, beats.MAGIC, _register_stack_dump(stacks))
    atexit.register(_exiting, channel)
    return channel


def _exiting(channel: _Channel) -> None:
    """The interpreter is shutting down (teardown can be slow): judged by the first-heartbeat timeout."""
    if _state.get("channel") is channel:
        channel.enter("exiting", 0.0)


def _register_stack_dump(stacks) -> int:
    """The first free real-time signal dumps every thread's stack to ``stacks``; 0 when none is free."""
    if not hasattr(signal, "SIGRTMAX") or threading.current_thread() is not threading.main_thread():
        return 0
    for signum in range(signal.SIGRTMAX - 1, signal.SIGRTMAX - 6, -1):
        try:
            if signal.getsignal(signum) != signal.SIG_DFL:
                continue  # the program's own
            faulthandler.register(signum, file=stacks, all_threads=True, chain=False)
            return signum
        except (OSError, ValueError, RuntimeError):
            continue
    return 0


def _forget_after_fork() -> None:
    """A forked child (a data loader's worker) is not the rank: its calls do nothing."""
    global _beat
    _state["channel"] = None
    _beat = _noop


os.register_at_fork(after_in_child=_forget_after_fork)
