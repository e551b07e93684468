"""torch's rendezvous backend and handler checks, on the etcd backend the torchrun plugin hands to torch.

- The backend contract (torch's RendezvousBackendTestMixin checks get_state/set_state the same way;
  tests/contract.py is this project's suite of it) runs on ``TorchBackend`` over a real etcd, with
  torch's own ``RendezvousStateError`` for a corrupt state.
- torch's handler integration cases (dynamic_rendezvous_test.py's IntegrationTest: every node
  joins, a node beyond max_nodes waits in the redundancy list, and becomes a waiting node when a
  participant stops heartbeating) run torch's DynamicRendezvousHandler, built by the plugin's
  ``create_handler`` as torchrun builds it, over etcd. They look at the rendezvous through the
  handler (``num_nodes_waiting()``, and its state holder, which decodes torch's own state); the
  test never unpickles what etcd holds.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousStateError

from rendezvous import EtcdRendezvousBackend
from rendezvous.torchrun.plugin import TorchBackend, create_handler
from tests.contract import BackendContract


class TestTorchBackendContract(BackendContract):
    @pytest.fixture
    def backend(self, etcd_client, key_prefix):
        inner = EtcdRendezvousBackend(etcd_client, f"job-{uuid.uuid4().hex[:8]}", key_prefix)
        backend = TorchBackend(inner)
        backend.delete_state = inner.delete_state  # the contract's clean-up checks; not part of torch's ABC
        return backend

    def test_get_state_raises_torchs_state_error_if_the_state_is_corrupt(self, etcd_client, key_prefix):
        run_id = f"job-{uuid.uuid4().hex[:8]}"
        backend = TorchBackend(EtcdRendezvousBackend(etcd_client, run_id, key_prefix))
        backend.set_state(b"x")
        etcd_client.put(f"{key_prefix}/{run_id}/state", b"\x00 not a state written by the backend")
        with pytest.raises(RendezvousStateError):
            backend.get_state()

    def test_backend_name_is_the_plugins(self, backend):
        assert backend.name == "etcd-v3"


class _Handlers:
    """torch handlers for one job, each joining in a thread of its own; stopped at the end."""

    def __init__(self, endpoints: str, key_prefix: str) -> None:
        self.endpoints = endpoints
        self.key_prefix = key_prefix
        self.run_id = f"torch-{uuid.uuid4().hex[:8]}"
        self.handlers: list = []

    def new(self, min_nodes: int, max_nodes: int, **conf):
        params = RendezvousParameters(
            "etcd-v3",
            self.endpoints,
            self.run_id,
            min_nodes,
            max_nodes,
            local_addr=f"127.0.0.{len(self.handlers) + 1}",
            join_timeout="60",
            last_call_timeout="1",
            key_prefix=self.key_prefix,
            **conf,
        )
        handler = create_handler(params)
        self.handlers.append(handler)
        return handler

    @staticmethod
    def join(handler) -> dict:
        result: dict = {}

        def run() -> None:
            try:
                result["info"] = handler.next_rendezvous()
            except Exception as exc:  # noqa: BLE001 -- the test looks at it
                result["error"] = exc

        result["thread"] = threading.Thread(target=run, daemon=True)
        result["thread"].start()
        return result

    def close(self) -> None:
        for handler in self.handlers:
            handler._stop_heartbeats()


@pytest.fixture
def handlers(etcd_endpoints, key_prefix):
    made = _Handlers(etcd_endpoints, key_prefix)
    yield made
    made.close()


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_all_nodes_join_rendezvous(handlers):
    first, second = handlers.new(2, 2), handlers.new(2, 2)
    started = time.monotonic()
    joins = [handlers.join(first), handlers.join(second)]
    for join in joins:
        join["thread"].join(30)
        assert "info" in join, join.get("error")
    infos = [join["info"] for join in joins]
    assert {info.rank for info in infos} == {0, 1}
    assert [info.world_size for info in infos] == [2, 2]
    # both got the same bootstrap store address (rank 0's)
    assert infos[0].bootstrap_store_info.master_addr == infos[1].bootstrap_store_info.master_addr
    assert infos[0].bootstrap_store_info.master_port == infos[1].bootstrap_store_info.master_port
    print(f"\ntorch's handler over etcd: 2 nodes joined in {time.monotonic() - started:.2f} s, ranks 0 and 1")


def test_a_node_beyond_max_waits_then_takes_the_place_of_one_that_stops_heartbeating(handlers, monkeypatch):
    # With the TCP store shared (torch's default), a rank 0 that stays rank 0 publishes the master
    # address in round 0 only, and a node new in round 1 waits for it in round 1's keys: torch's
    # handler does that on any backend. Each round publishes its own without sharing.
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # One keep-alive interval for all (1 s; torch drops a node after 3 missed): only the silenced
    # node can be dropped, and only for its silence.
    first, second = handlers.new(1, 2, keep_alive_interval="1"), handlers.new(1, 2, keep_alive_interval="1")
    joins = [handlers.join(first), handlers.join(second)]
    for join in joins:
        join["thread"].join(30)
        assert "info" in join, join.get("error")
    third = handlers.new(1, 2, keep_alive_interval="1")
    late = handlers.join(third)  # the round is full: the redundancy list
    _wait(lambda: third._this_node in _state(first).redundancy_list, 15, "the third node in the redundancy list")
    time.sleep(4)  # longer than torch's 3 missed heartbeats: nobody heartbeating is dropped
    assert set(_participants(first)) == {first._this_node, second._this_node}
    assert first.num_nodes_waiting() == 0  # torch counts the wait list, not the redundancy list
    second._stop_heartbeats()  # a participant goes silent: torch drops it after its keep-alive timeout
    silenced = time.monotonic()
    _wait(lambda: set(_participants(first)) == {first._this_node}, 30, "the silent participant to be dropped")
    dropped_after = time.monotonic() - silenced
    assert dropped_after >= 2.0, f"dropped {dropped_after:.1f} s after it went silent: not for its silence"
    # the redundant node moved to the wait list: the agent is asked for a new round
    _wait(lambda: first.num_nodes_waiting() == 1, 10, "the late node in the wait list")
    again = handlers.join(first)  # what the agent does when nodes wait: a new round
    for join in (again, late):
        join["thread"].join(30)
        assert "info" in join, join.get("error")
    ranks = {again["info"].rank, late["info"].rank}
    assert ranks == {0, 1} and late["info"].world_size == 2
    assert set(_participants(first)) == {first._this_node, third._this_node}
    print(
        f"\ntorch's handler over etcd: the silenced participant was dropped {dropped_after:.1f} s after its last "
        f"heartbeat; the late node took its place (ranks {sorted(ranks)})"
    )


def _state(handler):
    handler._state_holder.sync()
    return handler._state_holder.state


def _participants(handler) -> dict:
    return dict(_state(handler).participants)


def test_the_agent_store_is_never_shared_and_torchs_switch_is_left_as_it_was(handlers, monkeypatch):
    """A difference from torch's handler, said in the README: each round's workers bootstrap on a
    store of their own (tests/parity/test_plugin_store.py shows why), whatever the switch says;
    the switch is set only while a round forms."""
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    handler = handlers.new(1, 1)
    assert handler.use_agent_store is False
    join = handlers.join(handler)
    join["thread"].join(30)
    assert "info" in join, join.get("error")
    assert join["info"].bootstrap_store_info.master_port > 0
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")
    assert handlers.new(1, 2).use_agent_store is False
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
