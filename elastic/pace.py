"""Own-work timing for straggler scores: how long this rank takes for the part of a step that is
its own, before it waits for the others.

In synchronous training every rank's step takes the same wall time -- the fast ranks wait for the
slow one in the all-reduce -- so a step's length cannot tell which rank is slow. What each rank does
*before* it reaches the collective can:

    import elastic

    model = elastic.watch_ddp(DistributedDataParallel(model))    # DDP: nothing else to change

    for batch in loader:                                          # any other script
        with elastic.section():
            loss = compute(batch)                                 # this rank's own work
        all_reduce(...)                                           # waiting for the others: outside

Under elastic-run each span's length goes into the worker's heartbeat record (shared memory, no
system call); the agent scores each rank against the job's fastest (``launcher.pace``) and names a
rank whose score stays below 0.75 a straggler. Anywhere else both do nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .heartbeat import _channel

__all__ = ["section", "watch_ddp"]

_depth = threading.local()


@contextmanager
def section() -> Iterator[None]:
    """Time the block as this rank's own work (a step's compute, before its collective). Sections
    nest: only the outermost one counts. Usable as a decorator too."""
    channel = _channel()
    outer = channel is not None and not getattr(_depth, "n", 0)
    _depth.n = getattr(_depth, "n", 0) + 1
    started = time.monotonic()
    try:
        yield
    finally:
        _depth.n -= 1
        if outer:
            channel.worked(time.monotonic() - started)


class _DdpPace:
    """The communication hook's state: when the last all-reduce of the step before completed."""

    def __init__(self, process_group: Any) -> None:
        self.process_group = process_group
        self.done_at: float | None = None
        self.channel = _channel()

    def hook(self, state, bucket):  # no annotations: DDP checks the hook's against its own
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        last = bucket.is_last()
        if last and self.done_at is not None:
            self.channel.worked(time.monotonic() - self.done_at)  # this step's own work: its gradients are ready
        future = allreduce_hook(self.process_group, bucket)
        if not last:
            return future

        def completed(done: Any) -> Any:
            self.done_at = time.monotonic()  # the rank leaves the step's collective: its own work starts again
            return done.value()

        return future.then(completed)


def watch_ddp(model: Any, process_group: Any = None) -> Any:
    """Time this rank's own work in each step of a ``DistributedDataParallel`` model: from the end of
    the step before (its last all-reduce done) to the moment its last gradient bucket is ready.
    Registers DDP's plain all-reduce as the model's communication hook, timed (a model with a hook
    of its own: use ``section`` instead). Returns the model; does nothing outside elastic-run."""
    pace = _DdpPace(process_group)
    if pace.channel is not None:
        model.register_comm_hook(None, pace.hook)
    return model
