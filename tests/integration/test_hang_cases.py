"""The hang case protocol in real etcd (launcher/hangs/cases.py, rendezvous/job/hangboard.py): a
case whose ranks are all set aside by the time the nodes report (a rank found past its script's
code, freeing what ``main()`` left: the exit watch's to judge) closes without a verdict, so that a
rank hung later in the same round opens a case of its own and is judged on fresh reports."""

from __future__ import annotations

import time

from launcher.hangs.cases import COLLECT, CaseFollower
from launcher.hangs.hangrules import RankReport
from rendezvous.job.hangboard import HangBoard
from rendezvous.job.keys import JobKeys


def _overdue(rank: int, silent: float) -> RankReport:
    now = time.time()
    return RankReport(rank, "a", now - silent, now - 60.0, silent, 1.1, "step", "step", True)


def test_a_case_whose_ranks_were_set_aside_closes_and_a_later_hang_is_judged_on_its_own(etcd_client, key_prefix):
    keys = JobKeys(key_prefix, "job")
    lease = etcd_client.grant_lease(30)
    shown: list[list[RankReport]] = [[_overdue(0, 1.3)]]  # rank 0 quiet past its learned timeout

    def look(ranks: set[int]) -> dict:
        if ranks == {0}:  # its stack: past its script's code -- the watch sets it aside, as if exited
            shown[0] = []
        return {}

    board = HangBoard(etcd_client, keys, 3, "a", lease)
    cases = CaseFollower(lambda: board, lambda now: shown[0], lambda now: {}, look, node="a", nodes=1, wall=time.time)
    try:
        assert cases.follow(0.0) is None  # case 1 opened; its report names no rank
        assert cases.follow(0.1) is None and cases.follow(COLLECT + 0.1) is None
        shown[0] = [_overdue(1, 2.0)]  # later in the round, rank 1 hangs in the script
        verdict = None
        for tick in range(1, 40):
            verdict = cases.follow(COLLECT + 0.1 + tick * 0.25)
            if verdict is not None:
                break
        assert verdict is not None and verdict.hung and verdict.culprit.rank == 1, verdict
        assert board.verdict(1) is None and board.verdict(2) is not None  # judged in case 2, on its own report
    finally:
        cases.close()
        etcd_client.revoke_lease(lease)
