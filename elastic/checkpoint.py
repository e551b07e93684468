"""State kept in memory across worker restarts: ``save`` after a step, ``load`` when starting.

    import elastic.checkpoint as ckpt

    state = ckpt.load()                       # None on the first start
    start = state["step"] + 1 if state else 0
    if state:
        model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
    for step in range(start, steps):
        train_step()
        ckpt.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, step=step)

``save`` writes the rank's state (tensors and plain values, torch.save's format) into shared memory
that the agent owns (``launcher/workers/checkpoints.py``): it survives this process, and ``load`` in the
restarted worker maps the newest copy back in milliseconds. With ``--checkpoint-dir DIR`` the agent
also copies the newest save of each rank to DIR every ``--checkpoint-every`` saves and at its end;
``load`` falls back to those when memory has none (a new node). ``load(replicated=True)`` is for state
that is the same on every rank (DDP): any rank's copy will do, and, called after
``init_process_group``, the ranks agree on the newest copy any of them has -- in memory on a
surviving node, or on disk -- and the rank holding it sends it to those that do not.

Outside elastic-run (no agent memory) ``save`` raises ``NotLaunchedError`` and ``load`` returns None.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

from launcher.workers.checkpoints import (
    ENV_DIR,
    ENV_EVERY,
    ENV_MEMORY,
    Copy,
    copies_at,
    drop_superseded,
    due_marker,
    file_name,
)
from launcher.workers.checkpoints import newest as newest_of

from .worker import NotLaunchedError

__all__ = ["save", "load", "newest"]

_saves = 0  # this process's saves, for the copies on disk every N
_last_step = -1  # the step of the newest copy this process saved or loaded


def save(state: Any, *, step: int | None = None) -> int:
    """Keep ``state`` (a state_dict of tensors and plain values) in the agent's memory as this
    rank's newest copy; returns its step (default: one after the last saved or loaded)."""
    global _saves, _last_step
    memory = os.environ.get(ENV_MEMORY)
    if not memory:
        raise NotLaunchedError("elastic.checkpoint.save needs the memory elastic-run's agent gives its workers")
    import torch

    rank = int(os.environ["RANK"])
    step = _last_step + 1 if step is None else int(step)
    name = file_name(rank, step)
    partial = os.path.join(memory, f".{name}.{os.getpid()}.partial")
    with _without_crc32(torch):
        torch.save(state, partial)
    os.replace(partial, os.path.join(memory, name))
    drop_superseded(memory, rank)
    _saves, _last_step = _saves + 1, step
    every = int(os.environ.get(ENV_EVERY) or 0)
    if every and _saves % every == 0:
        open(os.path.join(memory, due_marker(rank)), "w").close()  # the agent copies it to disk
    return step


def newest(*, replicated: bool = False) -> tuple[str, Copy] | None:
    """Where the newest copy this node can read is (memory first, then the directory on disk):
    this rank's, or with ``replicated`` any rank's."""
    rank = None if replicated else int(os.environ.get("RANK", "0"))
    found = []
    for where in (os.environ.get(ENV_MEMORY), os.environ.get(ENV_DIR)):
        copy = newest_of(copies_at(where), rank)
        if copy is not None:
            found.append((copy.step, -len(found), where, copy))
    if not found:
        return None
    _, _, where, copy = max(found)  # the newest step; on a tie, memory
    return where, copy


def load(*, replicated: bool = False) -> Any | None:
    """This rank's newest state (None if there is none): from memory, else from disk; with
    ``replicated`` and a process group, the newest any rank has."""
    global _last_step
    import torch

    found = newest(replicated=replicated)
    if replicated and _grouped(torch):
        state, step = _agree(torch, found)
    elif found is None:
        return None
    else:
        where, copy = found
        state, step = _read(torch, where, copy), copy.step
    if state is not None:
        _last_step = step
    return state


def _read(torch, where: str, copy: Copy) -> Any:
    return torch.load(os.path.join(where, copy.name), weights_only=True, mmap=True)


def _grouped(torch) -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _agree(torch, found: tuple[str, Copy] | None) -> tuple[Any, int]:
    """Every rank learns the newest step any rank holds; the lowest rank holding it sends it."""
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    step = found[1].step if found is not None else -1
    best = torch.tensor([step], dtype=torch.int64, device=device)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    newest_step = int(best.item())
    if newest_step < 0:
        return None, -1
    holder = torch.tensor([dist.get_rank() if step == newest_step else dist.get_world_size()], device=device)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    sender = int(holder.item())
    box = [_read(torch, *found) if dist.get_rank() == sender else None]
    dist.broadcast_object_list(box, src=sender, device=device)
    return box[0], newest_step


@contextmanager
def _without_crc32(torch):
    """torch.save without its zip checksums: a copy in memory is not read back through a disk or
    a network, and the checksum is half the time of a save."""
    serialization = torch.serialization
    before = serialization.get_crc32_options()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(before)
