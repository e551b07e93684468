"""In-process keeping, on the agent's side: the workers under ``elastic.inprocess`` that a round's end
parks (they leave ``train`` and wait) and the next round resumes in place (their new environment over
the control channel, ``inprocess.InprocessHost``), instead of new processes.

The group hands its workers in and takes them back; the keeper holds the parked ones by local rank
in between. A worker is any object with ``spec.local_rank`` and a ``process`` (``pid``, ``poll()``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .host import InprocessHost

__all__ = ["Keeper"]


class Keeper:
    def __init__(self, host: InprocessHost | None) -> None:
        self._host = host  # None: nothing is ever kept
        self.kept: dict[int, Any] = {}  # local rank -> a parked worker the next round resumes

    def runs_under(self, workers: Sequence[Any]) -> bool:
        """Whether these workers (and the kept ones) run under ``elastic.inprocess``: known from each
        one's hello, so also after it died."""
        pids = [w.process.pid for w in (*workers, *self.kept.values())]
        return self._host is not None and self._host.heard_from(pids)

    def park(self, workers: Sequence[Any], grace: float, spare: Sequence[int] = ()) -> list[Any]:
        """Ask the running, connected workers (but the local ranks in ``spare``) to leave ``train``;
        the ones that did within ``grace`` seconds are kept, and returned."""
        if self._host is None:
            return []
        live = [
            w
            for w in workers
            if w.spec.local_rank not in spare and w.process.poll() is None and self._host.connected(w.process.pid)
        ]
        parked = self._host.park([w.process.pid for w in live], grace) if live else set()
        self.kept = {w.spec.local_rank: w for w in live if w.process.pid in parked}
        return list(self.kept.values())

    def resume(self, local_rank: int, error_file: str, env: Mapping[str, str]) -> Any | None:
        """The kept worker of this local rank, given the new round's ``env`` (None: none is kept, or
        it is gone, and it stays here to be ended with the rest)."""
        worker = self.kept.pop(local_rank, None)
        if worker is None:
            return None
        if os.path.isfile(error_file):
            os.unlink(error_file)
        if worker.process.poll() is not None or not self._host.resume(worker.process.pid, env):
            self.kept[local_rank] = worker
            return None
        return worker

    def release(self) -> list[Any]:
        """Every kept worker, no longer kept (the group ends them)."""
        released, self.kept = list(self.kept.values()), {}
        return released
