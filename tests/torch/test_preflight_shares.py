"""The pre-flight check's figures are one view for every node: group rank 0 waits for everyone's,
publishes what it saw, and each node -- the late one too -- takes that, so their next pairs and
their findings are the same. Shown on a real c10d store (torch's TCPStore), nodes as threads."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from launcher.preflight import probe  # noqa: E402


def _nodes(delays: dict[int, float], timeout: float = 1.0) -> dict[int, dict]:
    """Each of 3 nodes shares its rank + 0.5 after ``delays[rank]`` seconds: what each got."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    got: dict[int, dict] = {}

    def node(rank: int) -> None:
        store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
        time.sleep(delays.get(rank, 0.0))
        got[rank] = probe._share(store, {"round": 1, "rank": rank, "nodes": 3, "timeout": timeout}, "t1", rank + 0.5)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return got


def test_every_node_gets_every_figure_when_all_write_in_time():
    got = _nodes({})
    assert got == {rank: {0: 0.5, 1: 1.5, 2: 2.5} for rank in range(3)}


def test_a_figure_written_after_rank_0_gave_up_is_missing_for_every_node_the_late_one_too():
    got = _nodes({2: 2.0})  # rank 0 waits 1 s; rank 2 writes after 2 s and can read its own
    assert got == {rank: {0: 0.5, 1: 1.5, 2: None} for rank in range(3)}, got
