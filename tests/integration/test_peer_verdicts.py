"""The watchers' verdict in real etcd (rendezvous/job/lostboard.py): a peer's lease ends only when
every one of its watchers accuses it -- one watcher whose link to it is cut while the other's stays
up ends nothing -- and an accusation withdrawn when the peer answers again no longer counts."""

from __future__ import annotations

import json

from rendezvous.job.keys import JobKeys
from rendezvous.job.lostboard import Verdicts
from rendezvous.job.ranktable import Target


def _setup(etcd_client, key_prefix):
    keys = JobKeys(key_prefix, "job")
    leases = {name: etcd_client.grant_lease(30) for name in ("peer", "w1", "w2")}
    peer = Target("peer", "127.0.0.1:1", leases["peer"], watchers=2)
    watchers = [Verdicts(etcd_client, keys, w, lambda w=w: leases[w], 3) for w in ("w1", "w2")]
    return keys, leases, peer, watchers


def test_one_watcher_cut_off_from_a_peer_ends_nothing_while_the_other_still_hears_it(etcd_client, key_prefix):
    keys, leases, peer, (w1, w2) = _setup(etcd_client, key_prefix)
    assert w1.accuse(peer, "its probe connection was closed") is False  # w2 still hears it
    assert etcd_client.lease_ttl(leases["peer"]) > 0 and etcd_client.count_prefix(keys.lost) == 0
    assert w1.withdraw("peer") and etcd_client.count_prefix(keys.suspects(3, "peer")) == 0  # it answered w1 again
    assert w2.accuse(peer, "no answer for 1.0 s") is False  # w1's earlier word no longer counts
    assert etcd_client.lease_ttl(leases["peer"]) > 0
    for lease in leases.values():
        etcd_client.revoke_lease(lease)


def test_when_every_watcher_accuses_the_peer_its_lease_ends_and_its_round_is_recorded_lost(etcd_client, key_prefix):
    keys, leases, peer, (w1, w2) = _setup(etcd_client, key_prefix)
    assert w1.accuse(peer, "no answer for 1.0 s") is False
    assert w2.accuse(peer, "no answer for 1.0 s") is True
    assert etcd_client.lease_ttl(leases["peer"]) == -1  # ended: its keys go with it
    record = etcd_client.get(keys.lost_in(3, "peer"))
    assert record is not None and json.loads(record.value) == {"why": "no answer for 1.0 s", "by": "w2"}
    assert w1.close() and w2.close() and etcd_client.count_prefix(keys.suspects(3, "peer")) == 0
    for name in ("w1", "w2"):
        etcd_client.revoke_lease(leases[name])
