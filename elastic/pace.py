"""Own-work timing for straggler scores: how long this rank takes for the part of a step that is
its own, before it waits for the others.

In synchronous training every rank's step takes the same wall time -- the fast ranks wait for the
slow one in the all-reduce -- so a step's length cannot tell which rank is slow. What each rank does
*before* it reaches the collective can:

    import elastic

    model = elastic.watch_ddp(DistributedDataParallel(model))    # DDP: one line

    for batch in loader:                                          # any other script
        with elastic.section():
            loss = compute(batch)                                 # this rank's own work
        all_reduce(...)                                           # waiting for the others: outside

Under elastic-run each span's length goes into the worker's heartbeat record (shared memory), less
the time the timing thread spent runnable but waiting for a CPU within it (the kernel's schedstat
for the thread, read at both ends: a loaded machine slows a rank's wall clock, not its work); the
agent scores each rank against the job's fastest (``launcher.pace``) and names a rank whose score
stays below 0.75 a straggler. Anywhere else both do nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .heartbeat import _channel

__all__ = ["section", "watch_ddp"]

_depth = threading.local()
_schedstat = threading.local()  # this thread's schedstat descriptor, and the process it was opened in


class _Schedstat:
    """One thread's ``/proc/thread-self/schedstat``, open for as long as the thread uses it: a read
    is one ``pread`` (about a microsecond), closed once, by its own finalizer."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1  # no procfs, or no schedstats: nothing credited

    def waited(self) -> float:
        if self.fd < 0:
            return 0.0
        try:
            return int(os.pread(self.fd, 64, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1


def _cpu_wait() -> float:
    """Seconds the calling thread has been runnable but waiting for a CPU (0.0 where not known). A
    forked child opens its own: the parent's descriptor names the parent's thread."""
    stats = getattr(_schedstat, "stats", None)
    if stats is None or stats.pid != os.getpid():
        stats = _schedstat.stats = _Schedstat()
    return stats.waited()


@contextmanager
def section() -> Iterator[None]:
    """Time the block as this rank's own work (a step's compute, before its collective). Sections
    nest: only the outermost one counts. Usable as a decorator too."""
    channel = _channel()
    outer = channel is not None and not getattr(_depth, "n", 0)
    _depth.n = getattr(_depth, "n", 0) + 1
    started, waited = (time.monotonic(), _cpu_wait()) if outer else (0.0, 0.0)
    try:
        yield
    finally:
        _depth.n -= 1
        if outer:
            channel.worked(_own(started, waited))


def _own(started: float, waited: float) -> float:
    """Seconds since ``started`` less this thread's wait for a CPU since it read ``waited``. The wait
    is read before the clock, as the clock before the wait at the start: a wait that falls between
    two reads is in the span's length and not taken off (never taken off a length that lacks it)."""
    wait = _cpu_wait() - waited
    return max(0.0, time.monotonic() - started - wait)


class _DdpPace:
    """A DDP model's own-work spans: from its forward's start to the moment every gradient of the
    backward that follows is computed (DDP all-reduces its buckets meanwhile and waits for them
    after: the wait is not own work). On a GPU the span is timed by CUDA events on the current
    stream, read a step later, when they have completed; on CPU by the clock, less the forward's
    thread's wait for a CPU (the backward of a CPU model runs on the thread that called it)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.started: Any = None  # this step's forward start (a time and a CPU wait, or a CUDA event)
        self.pending: list[tuple[Any, Any]] = []  # CUDA spans not yet completed

    def forward_started(self, module: Any, args: Any) -> None:
        import torch

        self._settle()
        if not torch.is_grad_enabled():
            self.started = None  # evaluation: no backward follows
        elif _on_cuda(module):
            self.started = torch.cuda.Event(enable_timing=True)
            self.started.record()
        else:
            self.started = (time.monotonic(), _cpu_wait(), threading.get_native_id())

    def gradients_ready(self, grads: Any) -> None:
        import torch

        started, self.started = self.started, None
        if started is None:
            return
        if isinstance(started, tuple):
            at, waited, thread = started
            same = thread == threading.get_native_id()  # else another thread's wait: none credited
            self.channel.worked(_own(at, waited) if same else time.monotonic() - at)
            return
        ended = torch.cuda.Event(enable_timing=True)
        ended.record()
        self.pending.append((started, ended))

    def _settle(self) -> None:
        """The CUDA spans whose end has completed, timed; the others wait for a later look."""
        while self.pending and self.pending[0][1].query():
            started, ended = self.pending.pop(0)
            self.channel.worked(started.elapsed_time(ended) / 1000.0)
        del self.pending[:-8]  # a model never stepped again keeps no more than a few events


def _on_cuda(module: Any) -> bool:
    for parameter in module.parameters():
        return parameter.is_cuda
    return False


def watch_ddp(model: Any) -> Any:
    """Time this rank's own work in each step of a ``DistributedDataParallel`` model (or any module
    trained with ``backward``): from its forward's start to the moment all the gradients of its
    backward are computed -- what it does before it waits for the others' gradients. A forward
    pre-hook and an autograd hook on the parameters; no communication hook (a model keeps its own,
    and DDP's all-reduce stays in C++). Returns the model; does nothing outside elastic-run."""
    channel = _channel()
    if channel is None:
        return model
    import torch

    pace = _DdpPace(channel)
    parameters = [p for p in model.parameters() if p.requires_grad]
    model.register_forward_pre_hook(pace.forward_started)
    if parameters:
        torch.autograd.graph.register_multi_grad_hook(parameters, pace.gradients_ready)  # once all are computed
    return model
