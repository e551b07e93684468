"""The torchrun plugin through etcd's faults: torch's handler gets torch's own error classes, so its
keep-alive thread lives through an etcd freeze and shutdown() says False instead of raising."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import api as torch_rdzv

from rendezvous import EtcdClient, EtcdRendezvousBackend, EtcdServer
from rendezvous.torchrun.plugin import EtcdStore, TorchBackend, create_handler


@pytest.fixture
def own_etcd():
    with EtcdServer() as server:
        yield server
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)


KEEP_ALIVE, MISSED, READ_TIMEOUT = 2, 3, 1  # torch drops a node after MISSED beats not seen
BEAT_AFTER_THAW = KEEP_ALIVE + READ_TIMEOUT


def _handler(endpoints: str, run_id: str):
    params = RendezvousParameters(
        "etcd-v3",
        endpoints,
        run_id,
        1,
        1,
        local_addr="127.0.0.1",
        keep_alive_interval=KEEP_ALIVE,
        keep_alive_max_attempt=MISSED,
        read_timeout=READ_TIMEOUT,
    )
    return create_handler(params)


def _keep_alive_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("RendezvousKeepAliveTimer")]


def _my_heartbeat(handler) -> datetime:
    handler._state_holder.sync()
    return handler._state_holder.state.last_heartbeats[handler._this_node]


def test_a_3_s_etcd_freeze_leaves_torchs_keep_alive_alive_and_heartbeating(own_etcd):
    handler = _handler(own_etcd.endpoints, "plugin-freeze")
    handler.next_rendezvous()
    assert _keep_alive_threads(), "torch's keep-alive timer runs"
    os.kill(own_etcd.process.pid, signal.SIGSTOP)
    time.sleep(3)
    os.kill(own_etcd.process.pid, signal.SIGCONT)
    thawed = datetime.now(timezone.utc)
    # torch drops a node after 3 missed beats (6 s here): the first beat after the thaw must come
    # within one keep-alive interval and one read timeout (3 s), not whenever.
    deadline = time.monotonic() + BEAT_AFTER_THAW + 0.5
    while True:
        beat = _my_heartbeat(handler)
        beat = beat if beat.tzinfo else beat.replace(tzinfo=timezone.utc)
        if beat > thawed:
            break
        assert time.monotonic() < deadline, f"no heartbeat within {BEAT_AFTER_THAW} s of the thaw (last {beat})"
        time.sleep(0.1)
    after = (beat - thawed).total_seconds()
    alive = _keep_alive_threads()
    print(
        f"\netcd frozen 3 s under torch's handler: keep-alive thread alive, heartbeat {after:.2f} s after the "
        f"thaw (torch drops a node after {KEEP_ALIVE * MISSED:g} s)"
    )
    assert after <= BEAT_AFTER_THAW
    assert alive and all(t.is_alive() for t in alive)
    assert handler.shutdown() is True


def test_shutdown_says_false_when_etcd_is_away(own_etcd):
    handler = _handler(own_etcd.endpoints, "plugin-shutdown")
    handler.next_rendezvous()
    own_etcd.stop_member(0)
    assert handler.shutdown() is False


def test_a_corrupt_state_is_torchs_state_error(own_etcd):
    client = EtcdClient(own_etcd.endpoints)
    try:
        backend = EtcdRendezvousBackend(client, "plugin-corrupt")
        client.put(backend.key, b"not ours")
        with pytest.raises(torch_rdzv.RendezvousStateError, match="not etcd-elastic state"):
            TorchBackend(backend).get_state()
    finally:
        client.close()


def test_store_errors_are_c10d_errors_and_a_timeout_says_timeout(own_etcd):
    client = EtcdClient(own_etcd.endpoints, timeout=1)
    store = EtcdStore(client, "plugin-store", timeout=timedelta(seconds=0.5))
    with pytest.raises(dist.DistStoreError, match=r"timeout after 0.5s waiting for store key 'missing'"):
        store.get("missing")
    own_etcd.stop_member(0)
    with pytest.raises(dist.DistNetworkError, match="cannot reach etcd"):
        store.set("k", b"v")
    client.close()


def test_clone_is_a_store_on_the_same_keys_usable_from_another_thread(own_etcd):
    import gc

    store = EtcdStore(EtcdClient(own_etcd.endpoints), "plugin-clone")
    prefixed = dist.PrefixStore("pfx", store)
    twin = prefixed.clone()  # torch's C++ PrefixStore clones the EtcdStore beneath it
    gc.collect()
    done = threading.Thread(target=lambda: twin.set("a", "from another thread"))
    done.start()
    done.join(10)
    assert prefixed.get("a") == store.get("pfx/a") == b"from another thread"
    assert isinstance(store.clone(), EtcdStore)
