"""The watcher and the responder on real sockets, the verdict in real etcd (launcher/peers/): a peer
that answers is heard and accused of nothing; one whose responder goes away closes the connection
and is accused at once; one frozen (SIGSTOP: its connection stays open) once its silence outlasts
the peer window. Its only watcher's accusation ends its lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from launcher.peers.contact import ContactLog
from launcher.peers.responder import Responder
from launcher.peers.watcher import PeerWatch
from launcher.peers.wire import timing
from rendezvous.job.keys import JobKeys
from rendezvous.job.lostboard import Verdicts
from rendezvous.job.ranktable import Target
from tests.e2e.cli_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 0.6  # seconds of silence that make a peer dead (the agents' peer_window, shortened)


def _watch(etcd_client, key_prefix, port: int, lease: int) -> tuple[PeerWatch, JobKeys]:
    keys = JobKeys(key_prefix, "job")
    verdicts = Verdicts(etcd_client, keys, "watcher", lambda: 0, 1)
    target = Target("peer", f"127.0.0.1:{port}", lease, watchers=1)
    return PeerWatch(1, [target], timing(WINDOW), verdicts), keys


@contextmanager
def _watching_a_live_peer(etcd_client, key_prefix) -> Iterator[tuple[PeerWatch, JobKeys, int, Responder]]:
    """A peer answering on loopback, on a lease of its own, watched until it was heard; all closed after."""
    lease = etcd_client.grant_lease(30)
    responder = Responder(ContactLog(timing(WINDOW).fence_after), "127.0.0.1", 0)
    started = time.monotonic()
    watch, keys = _watch(etcd_client, key_prefix, responder.port, lease)
    try:
        wait_for(lambda: watch.heard("peer"), 2.0, what="an answer from a live responder")
        assert watch.answered_since(started)
        yield watch, keys, lease, responder
    finally:
        watch.close()
        responder.close()
        if etcd_client.lease_ttl(lease) > 0:
            etcd_client.revoke_lease(lease)


def test_a_peer_that_answers_is_heard_and_accused_of_nothing(etcd_client, key_prefix):
    with _watching_a_live_peer(etcd_client, key_prefix) as (watch, keys, lease, _):
        time.sleep(3 * WINDOW)  # longer than the window: a live peer is never accused
        assert not watch.lagging()
        assert etcd_client.count_prefix(keys.suspects(1, "peer")) == 0 and etcd_client.lease_ttl(lease) > 0


def test_a_peer_whose_process_is_gone_closes_the_connection_and_is_accused_before_the_window(etcd_client, key_prefix):
    with _watching_a_live_peer(etcd_client, key_prefix) as (watch, keys, lease, responder):
        responder.close()  # its machine went away: the connection is closed, nothing answers
        gone = time.monotonic()
        wait_for(lambda: etcd_client.lease_ttl(lease) == -1, 5.0, what="the silent peer's lease to end")
        took = time.monotonic() - gone
        assert took < 3.0, f"{took:.2f} s from the silence to the lease's end"
        assert watch.lagging()
        why = etcd_client.get(keys.suspects(1, "peer") + "watcher")
        assert why is not None and b"connection was closed" in why.value, why  # not its silence: its close
        print(f"\nlease ended {took:.2f} s after the peer went silent (window {WINDOW} s)")


FROZEN_PEER = """
import sys, time
from launcher.peers.contact import ContactLog
from launcher.peers.responder import Responder
from launcher.peers.wire import timing
responder = Responder(ContactLog(timing(float(sys.argv[1])).fence_after), "127.0.0.1", 0)
print(responder.port, flush=True)
time.sleep(60)
"""


def test_a_frozen_peer_keeps_its_connection_and_is_accused_only_once_its_silence_outlasts_the_window(
    etcd_client, key_prefix
):
    """SIGSTOP: the peer's kernel keeps the connection open, nothing answers -- no close to go by."""
    lease = etcd_client.grant_lease(30)
    peer = subprocess.Popen(
        [sys.executable, "-c", FROZEN_PEER, str(WINDOW)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    watch = None
    try:
        watch, keys = _watch(etcd_client, key_prefix, int(peer.stdout.readline()), lease)
        wait_for(lambda: watch.heard("peer"), 5.0, what="an answer from the live peer")
        os.kill(peer.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(lambda: etcd_client.lease_ttl(lease) == -1, 5.0, what="the frozen peer's lease to end")
        took = time.monotonic() - frozen
        # silence counts from the last answer heard, up to one probe interval before the freeze
        early = WINDOW - timing(WINDOW).interval
        assert early <= took < WINDOW + 1.5, f"{took:.2f} s from the freeze to the lease's end (window {WINDOW} s)"
        why = etcd_client.get(keys.suspects(1, "peer") + "watcher")
        assert why is not None and b"no answer to probes" in why.value, why
        print(f"\nfrozen peer's lease ended {took:.2f} s after the freeze; the watcher said {why.value!r}")
    finally:
        if watch is not None:
            watch.close()
        peer.kill()
        peer.wait(10)
        if etcd_client.lease_ttl(lease) > 0:
            etcd_client.revoke_lease(lease)
