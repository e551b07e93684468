"""The nodes' paces in real etcd (rendezvous/job/paceboard.py, launcher/pace/): a node at a steady
pace writes its key once, and again only when it moves by more than a tenth; every node sees the
others' paces of its round by watch (not other rounds', not a value that is not ours); a node's key
goes with its lease; and a rank slower than another node's is scored against that node's pace."""

from __future__ import annotations

import time

from launcher.hangs import beatfile as beats
from launcher.pace import Change, PacedWorker, PaceWatch
from rendezvous.job.keys import JobKeys
from rendezvous.job.paceboard import NodePace, PaceBoard


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stepping(tmp_path, name: str):
    """A hand-written record and a function that adds one span of ``seconds`` to it."""
    path = str(tmp_path / f"{name}.beat")
    beats.create(path)
    totals = [0.0, 0]

    def step(seconds: float) -> None:
        totals[0] += seconds
        totals[1] += 1
        with open(path, "r+b") as handle:
            handle.seek(beats.WORK_AT)
            handle.write(beats.WORK.pack(*totals))

    return path, step


def _until(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_steady_node_writes_its_pace_once_and_again_only_when_it_moves(etcd_client, key_prefix, tmp_path):
    keys = JobKeys(key_prefix, "job")
    lease = etcd_client.grant_lease(30)
    path, step = _stepping(tmp_path, "a")
    clock, board = Clock(), PaceBoard(etcd_client, keys, "a")
    watch = PaceWatch([PacedWorker(0, 0, path)], board, node="a", round_=4, lease=lambda: lease, clock=clock)
    try:
        for tick in range(240):  # 60 s at a steady 50 ms a span, give or take 4 %
            step(0.05 * (1.0 + 0.04 * ((tick % 3) - 1)))
            clock.now += 0.25
            watch.tick()
        written = etcd_client.get(keys.pace("a"))
        assert written is not None and written.version == 1 and written.lease == lease
        assert NodePace("a", 4, 0.05, 0.05, 0).encode() == written.value
        for _ in range(120):  # 30 s at 70 ms a span: the median moves past 10 %
            step(0.07)
            clock.now += 0.25
            watch.tick()
        assert 2 <= etcd_client.get(keys.pace("a")).version <= 4
    finally:
        watch.close()
        board.close()
        etcd_client.revoke_lease(lease)
    assert etcd_client.get(keys.pace("a")) is None  # gone with the node's lease


def test_a_node_sees_the_others_paces_of_its_round_and_scores_its_rank_against_them(etcd_client, key_prefix, tmp_path):
    keys = JobKeys(key_prefix, "job")
    lease = etcd_client.grant_lease(30)
    board = PaceBoard(etcd_client, keys, "slow")
    etcd_client.put(keys.pace("fast"), NodePace("fast", 7, 0.04, 0.05, 0).encode(), lease=lease)
    etcd_client.put(keys.pace("old"), NodePace("old", 6, 0.001, 0.001, 9).encode(), lease=lease)  # another round
    etcd_client.put(keys.pace("junk"), b"not json", lease=lease)
    path, step = _stepping(tmp_path, "slow")
    clock = Clock()
    watch = PaceWatch([PacedWorker(0, 3, path)], board, node="slow", round_=7, lease=lambda: lease, clock=clock)
    try:
        assert [p.node for p in board.others(7)] == ["fast"]
        etcd_client.put(keys.pace("late"), NodePace("late", 7, 0.03, 0.03, 1).encode(), lease=lease)
        assert _until(lambda: sorted(p.node for p in board.others(7)) == ["fast", "late"])  # by watch
        changes = []
        for _ in range(60):
            step(0.06)  # twice the fastest node's 30 ms
            clock.now += 0.25
            changes += watch.tick()
        assert [(c.change, c.rank) for c in changes] == [(Change.STRAGGLING, 3)]
        assert abs(changes[0].score - 0.5) < 0.01 and changes[0].fastest == 0.03
        etcd_client.delete(keys.pace("late"))
        assert _until(lambda: [p.node for p in board.others(7)] == ["fast"])
    finally:
        watch.close()
        board.close()
        etcd_client.revoke_lease(lease)
