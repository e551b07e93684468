"""The stuck-at-exit rule (``launcher.hangs.exitstuck``) without processes: who is judged, when the
other nodes are asked, and what the one line says of a stack."""

from __future__ import annotations

from launcher.hangs.exitstuck import ExitWatch, blocked_in, stuck_ranks
from launcher.hangs.procstat import Usage
from launcher.restart import barrier_line

SPY = """Process 2643: python3 -u tutorial_ddp.py
Python v3.11.7

Thread 2643 (idle): "MainThread"
    0x7f6a494a412b (libc.so.6)
    std::thread::join (libstdc++.so.6)
    c10d::ProcessGroupGloo::~ProcessGroupGloo (libtorch_cpu.so)
    0x7f6a49095f7a (libffi.so.8.1.2)
    main (multinode.py:97)
    <module> (multinode.py:110)
Thread 2650 (idle): "pt_gloo_runloop"
    take_gil (ceval_gil.h:200)
"""

GDB = """Thread 3 (Thread 0x7f (LWP 12) "pt_gloo_runloop"):
#0  0x00007f in take_gil () from /lib/libpython3.11.so
Thread 1 (Thread 0x7e (LWP 10) "python3"):
#0  0x00007f in __futex_abstimed_wait_common () from /lib/libc.so.6
#1  0x00007f in __pthread_clockjoin_ex () from /lib/libc.so.6
#2  ?? ()
#3  c10d::ProcessGroupGloo::~ProcessGroupGloo() () at pg.cpp:12
"""


def test_no_rank_is_stuck_while_another_local_rank_is_live_and_working():
    assert stuck_ranks({0: 9.0, 1: 0.5}, exited=set(), local_ranks=[0, 1], bound=5) == ()
    assert stuck_ranks({1: 9.0}, exited={0}, local_ranks=[0, 1], bound=5) == (1,)
    assert stuck_ranks({1: 4.9}, exited={0}, local_ranks=[0, 1], bound=5) == ()


def test_every_quiet_live_rank_is_stuck_together_and_a_bound_of_0_judges_none():
    assert stuck_ranks({1: 6.0, 2: 7.0}, exited={0}, local_ranks=[0, 1, 2], bound=5) == (1, 2)
    assert stuck_ranks({1: 600.0}, exited={0}, local_ranks=[0, 1], bound=0) == ()
    assert stuck_ranks({}, exited={0, 1}, local_ranks=[0, 1], bound=5) == ()  # every rank exited: nothing to judge


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _usage(cpu: float = 1.0, chars: int = 10) -> Usage:
    return Usage(frozenset({7}), cpu, 0.0, chars, False)


def _watch(
    usages: dict, asked: list, clock: _Clock, bound: float = 5.0, done: bool = True, said: list | None = None
) -> ExitWatch:
    def others_done() -> bool:
        asked.append(clock.now)
        return done

    quiet = (said if said is not None else []).append
    return ExitWatch([0, 1], lambda r: 7, bound, others_done, quiet=quiet, clock=clock, usage=lambda p: usages["now"])


def test_a_quiet_rank_is_judged_once_the_bound_passed_and_the_other_nodes_finished():
    clock, asked, usages = _Clock(), [], {"now": _usage()}
    watch = _watch(usages, asked, clock)
    found = []
    for _ in range(12):
        found.append(watch.tick(frozenset({0}), ending=True))
        clock.now += 0.5
    assert found[:10] == [()] * 10 and found[10] == (1,), found  # 5 s of nothing at all, read every second
    assert asked == [105.0], asked  # the other nodes asked only once the rank was quiet long enough


def test_cpu_or_io_starts_the_quiet_stretch_again():
    clock, asked, usages = _Clock(), [], {"now": _usage()}
    watch = _watch(usages, asked, clock)
    for step in range(16):
        if step == 6:
            usages["now"] = _usage(chars=11)  # a byte written: it works (a save after the others left)
        assert watch.tick(frozenset({0}), ending=True) == (), step
        clock.now += 0.5
    assert watch.quiet_for(1) < 5.0


def test_nothing_is_judged_while_another_node_runs_and_nothing_before_the_job_ends():
    clock, asked, usages = _Clock(), [], {"now": _usage()}
    watch = _watch(usages, asked, clock, done=False)
    for _ in range(30):
        assert watch.tick(frozenset({0}), ending=True) == ()
        clock.now += 0.5
    assert asked, "the other nodes were never asked"
    idle = _watch(usages, [], clock)
    for _ in range(30):
        assert idle.tick(frozenset(), ending=False) == ()  # no rank exited 0 anywhere: the job runs
        clock.now += 0.5


def test_a_node_whose_live_ranks_went_quiet_says_so_once_and_takes_it_back_when_they_work_again():
    clock, said, usages = _Clock(), [], {"now": _usage()}
    watch = _watch(usages, [], clock, done=False, said=said)  # another node still runs (or is quiet too)
    for _ in range(20):
        watch.tick(frozenset({0}), ending=True)
        clock.now += 0.5
    assert said == [True], said  # one write of the node key, before the others were asked
    usages["now"] = _usage(cpu=2.0)  # it works again
    for _ in range(4):
        watch.tick(frozenset({0}), ending=True)
        clock.now += 0.5
    assert said == [True, False], said
    ends = _watch({"now": _usage()}, [], clock, done=True, said=(done_said := []))
    for _ in range(12):
        ends.tick(frozenset({0}), ending=True)
        clock.now += 0.5
    assert done_said == [True], done_said  # judged: the round's end says the rest, nothing taken back


def test_a_hang_verdict_on_a_rank_whose_peers_all_exited_is_the_exit_watchs():
    clock, asked, usages = _Clock(), [], {"now": _usage()}
    watch = _watch(usages, asked, clock)
    assert watch.covers(1, frozenset({0}))
    assert not watch.covers(1, frozenset())  # local rank 0 still runs: a hang as any other
    assert not _watch(usages, [], clock, done=False).covers(1, frozenset({0}))  # another node still runs


def test_the_line_names_the_innermost_native_and_python_frames():
    assert blocked_in(SPY, "py-spy") == (
        "std::thread::join (libstdc++.so.6) < c10d::ProcessGroupGloo::~ProcessGroupGloo (libtorch_cpu.so) "
        "< main (multinode.py:97) < <module> (multinode.py:110)"
    )
    assert blocked_in(GDB, "gdb") == (
        "__futex_abstimed_wait_common < __pthread_clockjoin_ex < c10d::ProcessGroupGloo::~ProcessGroupGloo()"
    )
    assert "no py-spy or gdb here" in blocked_in("python3 waits in futex_do_wait", "proc")


def test_the_exit_barriers_line_names_the_nodes_still_running():
    line = barrier_line(("n2", "n3"), 300.0)
    assert "timed out after 300 s: nodes still running their workers: n2, n3" in line


def test_a_node_record_says_quiet_only_when_it_is_and_quiet_counts_as_done_for_its_round():
    from rendezvous.job.state import NodeInfo

    quiet = NodeInfo("a", 3, "h", 2, 1, quiet=True)
    assert NodeInfo.decode(quiet.encode()) == quiet and b"quiet" not in NodeInfo("a", 3, "h", 2, 1).encode()
    assert quiet.done_round(3) and not quiet.finished_round(3) and not quiet.done_round(4)
