"""Hang blame without etcd or workers: reading what a rank does from its stack, and which rank the
job blames -- the oldest heartbeat, or, when heartbeats tie, the rank the others wait for."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from launcher.hangs.blame import (
    ELSEWHERE,
    MAYBE_WAITING,
    UNKNOWN,
    WAITING,
    Doing,
    Frame,
    blocked_at,
    doing,
    excerpt,
    main_frames,
    with_source,
)
from launcher.hangs.hangrules import RankReport
from launcher.hangs.verdict import Verdict, decide, ranks_text, stacks_wanted

SITE = "/venv/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"

# faulthandler's dump of a gloo rank in all_reduce, with a helper thread (listed first: the newest)
IN_ALL_REDUCE = f"""Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f00 (most recent call first):
  File "{C10D}", line 3252 in all_reduce
  File "{LOGGER}", line 83 in wrapper
  File "/job/train.py", line 40 in step
  File "/job/train.py", line 60 in <module>
"""

IN_A_LOADER = """Current thread 0x00007f00 (most recent call first):
  File "/job/train.py", line 12 in read_shard
  File "/job/train.py", line 38 in step
  File "/job/train.py", line 60 in <module>
"""

IN_BACKWARD = f"""Current thread 0x00007f00 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 353 in backward
  File "{SITE}/torch/_tensor.py", line 647 in backward
  File "/job/train.py", line 44 in step
  File "/job/train.py", line 60 in <module>
"""

UNDER_RUNPY = f"""Current thread 0x00007f00 (most recent call first):
  File "{C10D}", line 2730 in broadcast
  File "{LOGGER}", line 83 in wrapper
  File "/job/train.py", line 20 in train
  File "/opt/app/launcher/workers/fn_worker.py", line 51 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""


def test_the_main_thread_is_found_and_a_rank_in_a_collective_waits_in_it():
    frames = main_frames(IN_ALL_REDUCE)
    assert frames[0] == Frame(C10D, 3252, "all_reduce") and frames[-1].function == "<module>"
    assert doing(frames) == Doing(WAITING, "all_reduce", "train.py:40 in step")
    assert doing(main_frames(UNDER_RUNPY)) == Doing(WAITING, "broadcast", "train.py:20 in train")
    assert blocked_at(frames) == "distributed_c10d.py:3252 in all_reduce, called from train.py:40 in step"


def test_a_rank_in_its_own_code_or_in_a_blocking_call_of_its_own_line_is_told_apart():
    assert doing(main_frames(IN_A_LOADER)) == Doing(ELSEWHERE, "", "train.py:12 in read_shard")
    lines = {("/job/train.py", 12): "    work.wait()", ("/job/train.py", 38): "batch = read_shard()"}
    frames = with_source(main_frames(IN_A_LOADER), lambda f, n: lines.get((f, n), ""))
    assert frames[0].source == "work.wait()"
    assert doing(frames) == Doing(WAITING, "wait", "train.py:12 in read_shard")  # Work.wait, from C: no frame
    sleeping = with_source(main_frames(IN_A_LOADER), lambda f, n: "time.sleep(60)")
    assert doing(sleeping).kind == ELSEWHERE


def test_backward_may_wait_for_peers_and_no_stack_is_unknown():
    assert doing(main_frames(IN_BACKWARD)) == Doing(MAYBE_WAITING, "backward", "train.py:44 in step")
    assert doing([]) == Doing(UNKNOWN, "", "")
    assert Doing(UNKNOWN, "", "").said() == "with no stack (its process did not answer)"
    assert Doing(WAITING, "all_reduce", "train.py:40 in step").said() == "in all_reduce at train.py:40 in step"
    assert Doing(ELSEWHERE, "", "train.py:12 in read_shard").said() == "at train.py:12 in read_shard"


def test_an_excerpt_keeps_the_innermost_frames_within_its_bound():
    frames = [Frame(f"/job/mod{i}.py", i, f"f{i}", "x = 1") for i in range(200)]
    text = excerpt(frames, limit=1024)
    assert len(text.encode()) <= 1024 + 40
    assert text.startswith('File "/job/mod0.py", line 0 in f0\n    x = 1') and text.endswith("outer frames left out")


def _report(rank: int, last: float | None, silent: float, timeout: float = 4.0, node: str = "a", **kw) -> RankReport:
    kind, phase = kw.get("kind", "step"), kw.get("phase", "step")
    return RankReport(rank, node, last, 0.0, silent, timeout, kind, phase, True, kw.get("doing"))


def _doing(dump: str) -> Doing:
    return doing(main_frames(dump))


def test_the_rank_with_the_oldest_heartbeat_is_blamed_and_its_blocked_peers_counted():
    verdict = decide([_report(0, 100.2, 4.8, node="a"), _report(1, 100.0, 5.0, node="b"), _report(2, 104.9, 0.1)])
    assert verdict.hung and verdict.culprit.rank == 1 and verdict.blocked == 1 and verdict.tied == ()
    assert verdict.line() == (
        'rank 1 on node b hung: no heartbeat for 5.0 s (last in phase "step"; timeout 4.0 s; 1 rank blocked behind it)'
    )
    assert stacks_wanted(verdict) == [1] and verdict.culprit_label == "1"


@pytest.mark.parametrize("culprit", [0, 1])
def test_when_heartbeats_tie_the_rank_outside_torch_distributed_is_blamed_whatever_its_number(culprit):
    """Heartbeats right after the step's all_reduce: both ranks beat within a millisecond; the culprit
    stopped in its own code, its peer waits in the next all_reduce."""
    peer = 1 - culprit
    reports = [
        _report(culprit, 100.000, 5.0, node="n-c", doing=_doing(IN_A_LOADER)),
        _report(peer, 99.999, 5.001, node="n-p", doing=_doing(IN_ALL_REDUCE)),  # even beat a hair earlier
    ]
    verdict = decide(reports)
    assert verdict.hung and not verdict.deadlock and verdict.culprit.rank == culprit and verdict.tied == (peer,)
    line = verdict.line()
    assert line.startswith(f"rank {culprit} on node n-c hung: no heartbeat for 5.0 s"), line
    assert f"rank {peer} stopped within 50 ms of it; by the stacks, it is the one the others wait for" in line
    assert f"rank {peer} in all_reduce at train.py:40 in step" in line
    assert f"rank {culprit} at train.py:12 in read_shard" in line
    assert verdict.culprit_label == str(culprit)


@pytest.mark.parametrize("late", [Doing(UNKNOWN, "", ""), "loader"])
def test_when_the_oldest_rank_waits_in_a_collective_the_stalled_rank_outside_one_is_blamed(late):
    """Rank 1 beat 120 ms after rank 0, then stopped (SIGSTOPped: no stack; or in its data loader)
    while rank 0 was already in backward waiting for it: the oldest heartbeat is not the culprit."""
    late = _doing(IN_A_LOADER) if late == "loader" else late
    reports = [_report(0, 100.00, 5.12, doing=_doing(IN_BACKWARD)), _report(1, 100.12, 5.0, node="b", doing=late)]
    verdict = decide(reports)
    assert verdict.hung and verdict.culprit.rank == 1 and verdict.waiters == (0,) and verdict.tied == ()
    assert verdict.blocked == 1 and not verdict.deadlock
    line = verdict.line()
    assert line.startswith("rank 1 on node b hung: no heartbeat for 5.0 s"), line
    assert (
        f"rank 0 beat earlier, but it waits for it: rank 0 in backward at train.py:44 in step; rank 1 {late.said()}"
        in line
    )
    assert Verdict.from_dict(verdict.as_dict()) == verdict and verdict.record()["waiters"] == "0"
    # the later rank not yet past its own timeout: no hang until it is
    early = decide([reports[0], _report(1, 100.12, 3.9, node="b", doing=late)])
    assert not early.hung and early.culprit.rank == 1 and early.hold_until == 104.12
    # rank 1 learned a longer timeout (a slow step seen): silent past half rank 0's, it is still the one waited for
    longer = decide([reports[0], _report(1, 100.12, 5.0, timeout=12.0, node="b", doing=late)])
    assert not longer.hung and longer.culprit.rank == 1 and longer.hold_until == 112.12


def test_the_oldest_rank_waiting_is_blamed_when_every_other_rank_waits_too_or_is_still_running():
    waiting = _report(0, 100.0, 5.2, doing=_doing(IN_ALL_REDUCE))
    assert decide([waiting, _report(1, 100.2, 5.0, doing=_doing(IN_ALL_REDUCE))]).culprit.rank == 0
    assert decide([waiting, _report(1, 103.0, 1.0)]).culprit.rank == 0  # rank 1 beats: not stalled
    in_its_code = decide(
        [_report(0, 100.0, 5.2, doing=_doing(IN_A_LOADER)), _report(1, 100.2, 5.0, doing=_doing(IN_A_LOADER))]
    )
    assert in_its_code.culprit.rank == 0 and in_its_code.waiters == ()


def test_a_rank_in_backward_is_waited_for_less_surely_than_one_in_a_collective_and_more_than_one_in_its_code():
    reports = [
        _report(0, 100.0, 5.0, doing=_doing(IN_BACKWARD)),
        _report(1, 100.0, 5.0, doing=_doing(IN_ALL_REDUCE)),
        _report(2, 100.0, 5.0, doing=_doing(IN_A_LOADER)),
    ]
    assert decide(reports).culprit.rank == 2
    assert decide(reports[:2]).culprit.rank == 0 and not decide(reports[:2]).deadlock


def test_every_tied_rank_in_a_collective_is_a_deadlock_naming_each_call():
    reports = [
        _report(0, 100.00, 5.0, node="a", doing=_doing(IN_ALL_REDUCE)),
        _report(1, 100.01, 4.99, node="b", doing=_doing(UNDER_RUNPY)),
    ]
    verdict = decide(reports)
    assert verdict.hung and verdict.deadlock and verdict.culprit_label == "deadlock"
    assert verdict.line() == (
        "ranks 0, 1 hung in a deadlock: no heartbeat for 5.0 s (timeout 4.0 s), and each waits in a "
        "torch.distributed call -- different calls, so ranks that called different collectives: "
        "rank 0 in all_reduce at train.py:40 in step; rank 1 in broadcast at train.py:20 in train"
    )
    assert stacks_wanted(verdict) == [0, 1]
    same = decide([_report(r, 100.0, 5.0, doing=_doing(IN_ALL_REDUCE)) for r in range(4)])
    assert same.deadlock and same.line().endswith(
        "each waits in a torch.distributed call: ranks 0-3 in all_reduce at train.py:40 in step"
    )


def test_a_tie_with_no_stacks_says_it_cannot_tell():
    verdict = decide([_report(0, 100.00, 5.0), _report(1, 100.01, 4.99)])
    assert verdict.culprit.rank == 0 and verdict.tied == (1,) and not verdict.deadlock
    assert "rank 1 stopped within 50 ms of it and no stack came to tell which one the others wait for" in verdict.line()


def test_a_culprit_within_its_phase_timeout_is_no_hang_until_that_timeout_ends():
    verdict = decide(
        [_report(0, 100.0, 50.0, timeout=900.0, kind="phase", phase="checkpoint"), _report(1, 100.5, 49.5)]
    )
    assert not verdict.hung and verdict.hold_until == 1000.0


def test_the_verdict_carries_its_stacks_to_every_nodes_lines_and_to_the_history():
    verdict = decide(
        [
            _report(1, 100.0, 5.0, node="b", doing=_doing(IN_A_LOADER)),
            _report(0, 100.0, 5.0, doing=_doing(IN_ALL_REDUCE)),
        ]
    )
    verdict = replace(verdict, stacks=((1, 'File "/job/train.py", line 12 in read_shard'),))
    lines = verdict.lines()
    assert lines[0] == verdict.line()
    assert (
        lines[1]
        == 'stack of rank 1 (main thread, most recent call first):\nFile "/job/train.py", line 12 in read_shard'
    )
    record = verdict.record()
    assert (record["rank"], record["node"], record["tied"], record["deadlock"]) == (1, "b", "0", False)
    assert record["stack"].endswith("in read_shard") and record["why"] == verdict.line()
    assert (
        replace(verdict, stacks=()).lines()[1] == "rank 1: no stack came (its process did not answer the dump signal)"
    )


def test_verdicts_and_reports_survive_the_trip_through_etcd_and_bad_ones_are_refused():
    verdict = decide([_report(0, None, 20.0, timeout=math.inf), _report(1, 100.0, 5.0)])
    assert Verdict.from_dict(verdict.as_dict()) == verdict
    tied = decide(
        [_report(0, 100.0, 5.0, doing=_doing(IN_ALL_REDUCE)), _report(1, 100.0, 5.0, doing=Doing(UNKNOWN, "", ""))]
    )
    tied = replace(tied, stacks=((1, "x"),))
    assert Verdict.from_dict(tied.as_dict()) == tied
    assert RankReport.from_dict(tied.culprit.as_dict()) == tied.culprit
    with pytest.raises(ValueError, match="malformed"):
        Verdict.from_dict({"hung": True, "culprit": {"rank": "x"}})
    with pytest.raises(ValueError, match="malformed"):
        Verdict.from_dict({**tied.as_dict(), "stacks": [[1, 2]]})
    with pytest.raises(ValueError, match="malformed"):
        RankReport.from_dict({**tied.culprit.as_dict(), "doing": {"kind": "asleep"}})
    with pytest.raises(ValueError, match="malformed"):
        RankReport.from_dict({"rank": 1})


def test_ranks_are_written_with_runs_of_three_or_more_as_ranges():
    assert ranks_text([5, 0, 1, 2, 3, 7, 8]) == "0-3, 5, 7, 8"
    assert ranks_text(()) == ""
