"""State kept in memory for ``elastic.checkpoint``: the agent's side.

The agent owns a directory in shared memory (``/dev/shm``) for the job's time on this node; its
workers save their state there (``elastic/checkpoint.py``), one file per save,
``rank-<RANK>-step-<STEP>.pt`` in torch.save's format, written under a hidden name and renamed when
complete. A file there outlives the worker that wrote it, so a restarted worker loads the newest
in milliseconds. Every N saves (``--checkpoint-every``) a worker also leaves a marker,
``due-rank-<RANK>``: the agent's thread then copies that rank's newest file to the user's
directory (``--checkpoint-dir``) in the background, and at its end it copies the newest of each
rank and frees the memory; if the agent is killed outright its reaper removes the directory.

The names and the choices (which file is newest, which to delete, which save is due on disk) are
pure functions here, shared with the worker's side.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ENV_DIR",
    "ENV_EVERY",
    "ENV_MEMORY",
    "Copy",
    "CheckpointKeeper",
    "copies_at",
    "copies_in",
    "drop_superseded",
    "due_marker",
    "file_name",
    "memory_dir",
    "newest",
    "newest_save",
    "superseded",
]

ENV_MEMORY = "ELASTIC_CHECKPOINT_MEMORY"  # the agent's shared-memory directory
ENV_DIR = "ELASTIC_CHECKPOINT_DIR"  # the user's directory (--checkpoint-dir), where the agent writes copies
ENV_EVERY = "ELASTIC_CHECKPOINT_EVERY"  # a copy on disk every so many saves of a rank (--checkpoint-every)
_NAME = re.compile(r"^rank-(\d+)-step-(\d+)\.pt$")
_POLL = 0.2  # seconds between the keeper's looks at the memory directory


@dataclass(frozen=True, order=True)
class Copy:
    step: int
    rank: int
    name: str


def file_name(rank: int, step: int) -> str:
    return f"rank-{rank}-step-{step}.pt"


def memory_dir(prefix: str) -> str:
    """A new directory in shared memory (``/dev/shm``: never written back to a disk; else the
    temporary directory)."""
    return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)


def due_marker(rank: int) -> str:
    return f"due-rank-{rank}"


def copies_in(names: Iterable[str]) -> list[Copy]:
    """The complete copies among a directory's names (a hidden name is a save under way)."""
    found = []
    for name in names:
        match = _NAME.match(name)
        if match:
            found.append(Copy(int(match.group(2)), int(match.group(1)), name))
    return found


def newest(copies: Iterable[Copy], rank: int | None = None) -> Copy | None:
    """The newest copy of ``rank`` (None: of any rank, for state that is the same on every rank)."""
    mine = [c for c in copies if rank is None or c.rank == rank]
    return max(mine) if mine else None


def superseded(copies: Iterable[Copy], rank: int) -> list[Copy]:
    """``rank``'s copies older than its newest: deleted once a save completes."""
    mine = sorted(c for c in copies if c.rank == rank)
    return mine[:-1]


def copies_at(directory: str | None) -> list[Copy]:
    """The complete copies in ``directory`` (none when there is no such directory)."""
    try:
        return copies_in(os.listdir(directory)) if directory else []
    except (FileNotFoundError, NotADirectoryError):
        return []


def newest_save(directory: str | None) -> tuple[int, float] | None:
    """(step, when: the file's modification time, seconds since the epoch) of the newest complete
    copy in ``directory`` (None: none)."""
    for _ in range(3):  # a copy deleted under us was superseded: the newer one then
        found = newest(copies_at(directory))
        if found is None:
            return None
        try:
            return found.step, os.stat(os.path.join(directory or "", found.name)).st_mtime
        except FileNotFoundError:
            continue
    return None


def drop_superseded(directory: str, rank: int) -> None:
    """Delete ``rank``'s copies in ``directory`` older than its newest (one may be gone already)."""
    for old in superseded(copies_at(directory), rank):
        try:
            os.remove(os.path.join(directory, old.name))
        except FileNotFoundError:
            pass


class CheckpointKeeper:
    """The node's shared-memory directory for its workers' saves, and the background copies of
    the newest ones to the user's directory."""

    def __init__(self, directory: str | None, every: int) -> None:
        """``directory``: where copies go (None: memory only); ``every``: a copy every so many
        saves of a rank (and one at the end)."""
        self.memory = memory_dir("elastic-ckpt-")
        self.directory = directory
        self._every = max(1, every)
        self._written: dict[int, int] = {}  # rank -> the step last copied
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self._thread = threading.Thread(target=self._loop, name="checkpoint-copies", daemon=True)
            self._thread.start()

    def env(self) -> dict[str, str]:
        """What the workers are told: where to save, and where the copies on disk are."""
        disk = {ENV_DIR: self.directory, ENV_EVERY: str(self._every)} if self.directory else {}
        return {ENV_MEMORY: self.memory, **disk}

    def newest_step(self) -> int:
        """The newest step any local rank saved with ``elastic.checkpoint`` (-1: none)."""
        found = newest(copies_at(self.memory))
        return found.step if found is not None else -1

    def close(self) -> None:
        """The agent ends (its workers are gone): the newest copy of each rank to disk, then the
        memory is freed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._copy(final=True)
        shutil.rmtree(self.memory, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(_POLL):
            self._copy(final=False)

    def _copy(self, final: bool) -> None:
        for rank in sorted({c.rank for c in copies_at(self.memory)}):
            marker = os.path.join(self.memory, due_marker(rank))
            due = os.path.exists(marker)
            if not (final or due):
                continue
            if due:
                os.remove(marker)
            for _ in range(3):  # a copy deleted under us was superseded: the newer one then
                latest = newest(copies_at(self.memory), rank)
                if latest is None or self._written.get(rank) == latest.step:
                    break
                if self._write(latest):
                    self._written[rank] = latest.step
                    break

    def _write(self, copy: Copy) -> bool:
        """``copy`` into the user's directory under the same name (a hidden name until complete);
        then the rank's older copies there go. False if the worker deleted it first."""
        target = os.path.join(self.directory, copy.name)
        partial = os.path.join(self.directory, f".{copy.name}.partial")
        try:
            shutil.copyfile(os.path.join(self.memory, copy.name), partial)
        except FileNotFoundError:
            return False  # superseded while we looked: the next look takes the newer one
        os.replace(partial, target)
        drop_superseded(self.directory, copy.rank)
        return True
