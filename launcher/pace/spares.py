"""A straggler's replacement by a hot spare (``--replace-stragglers``): whether a spare waits, read
from etcd at most every ``LOOK`` seconds while a straggler stands; and the stepped-out node's wait
for the spare's round, so that it rejoins as a spare itself."""

from __future__ import annotations

import time

from rendezvous.errors import RendezvousError
from rendezvous.job.state import JobStatus
from rendezvous.rounds.handler import RendezvousHandler

__all__ = ["LOOK", "SpareLook", "wait_replaced"]

LOOK = 5.0  # seconds between looks for a hot spare while a straggler here waits for one


class SpareLook:
    def __init__(self, handler: RendezvousHandler) -> None:
        self._handler = handler
        self._looked = -LOOK

    def waiting(self) -> bool:
        """A hot spare waits for a place (False between looks, and while etcd is away)."""
        now = time.monotonic()
        if now - self._looked < LOOK:
            return False
        self._looked = now
        try:
            return self._handler.spares_waiting() > 0
        except RendezvousError:
            return False


def wait_replaced(handler: RendezvousHandler, round_: int, timeout: float) -> None:
    """Return once a round after ``round_`` runs or the job closed, or after ``timeout``: a node that
    stepped out for a spare rejoins only then, as a spare itself (a participant of the round before
    would be chosen again over the spare)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = handler.job_state()
        except RendezvousError:
            state = None
        closed = state is not None and state.status is JobStatus.CLOSED
        if closed or (state is not None and state.round > round_ and state.status is JobStatus.RUNNING):
            return
        time.sleep(0.2)
