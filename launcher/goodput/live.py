"""The job's account as metrics: group rank 0's agent reads the job's history at the start of each
of its rounds (in the background: the workers start meanwhile) and sets ``elastic_goodput_ratio``
and ``elastic_lost_seconds_total{cause}`` -- one read of at most the history's limit a round, and
none when the metrics endpoint is off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rendezvous.errors import RendezvousError
from rendezvous.job.history import Event

from .account import account_of

__all__ = ["publish_account"]


def publish_account(read: Callable[[], list[Event]], publish: Callable[[float, dict[str, float]], None]) -> None:
    """Read the history with ``read`` and ``publish(goodput, lost seconds by cause)``, in a thread
    of its own; etcd out of reach: nothing this time."""

    def run() -> None:
        try:
            events = read()
        except RendezvousError:
            return
        account = account_of(events, now=time.time())
        if account.wall > 0:
            publish(account.goodput, {cause.value: seconds for cause, seconds in account.lost.items()})

    threading.Thread(target=run, name="goodput", daemon=True).start()
