"""Stragglers: each rank's own-work pace scored against the job's fastest (``scores``, pure), the
agent's watch over a round (``pacewatch``), and a straggler's replacement by a hot spare
(``spares``, ``--replace-stragglers``). The workers' side is ``elastic.pace``; the nodes' paces in
etcd are ``rendezvous.job.paceboard``."""

from .pacewatch import PacedWorker, PaceWatch, Straggler
from .scores import Change

__all__ = ["PaceWatch", "PacedWorker", "Straggler", "Change"]
