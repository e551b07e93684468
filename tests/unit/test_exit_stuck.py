"""The stuck-at-exit rule (``launcher.hangs.exitstuck``) without processes: who is judged, when the
other nodes are asked, and what the one line says of a stack."""

from __future__ import annotations

from launcher.hangs.exitstuck import ExitWatch, stuck_ranks
from launcher.hangs.native import blocked_in, left_script
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


# py-spy's main thread in the suite's simulated deadlock (tutorial_ddp.py --stuck-rank), as read
MUTEX = """Thread 8036 (idle): "MainThread"
    0x7f17f9ca412b (libc.so.6)
    pthread_mutex_lock (libc.so.6)
    ffi_call (libffi.so.8.1.2)
    _ctypes_callproc (callproc.c:1262)
    Deadlock.__del__ (tutorial_ddp.py:38)
    <module> (tutorial_ddp.py:95)
    0x7f17f9c4524a (libc.so.6)
Thread 8051 (idle)
    c10d::ProcessGroupGloo::runLoop (libtorch_cpu.so)
"""

# PyTorch's own deadlock: main()'s frame is gone (popped before its locals are freed)
GLOO = """Thread 2643 (idle): "MainThread"
    0x7f6a494a412b (libc.so.6)
    std::thread::join (libstdc++.so.6.0.30)
    c10d::ProcessGroupGloo::~ProcessGroupGloo (libtorch_cpu.so)
    c10d::Reducer::~Reducer (libtorch_cpu.so)
    pybind11::class_<c10d::Reducer>::dealloc_without_manipulating_gil (libtorch_python.so)
    <module> (multinode.py:110)
    _run_code (<frozen runpy>:88)
"""

# every rank of a job hung in a collective, as read
COLLECTIVE = """Thread 8038 (idle): "MainThread"
    pthread_cond_timedwait (libc.so.6)
    gloo::transport::tcp::UnboundBuffer::waitRecv (libtorch_cpu.so)
    c10d::ProcessGroupGloo::RecvWork::wait (libtorch_cpu.so)
    pybind11::cpp_function::dispatcher (libtorch_python.so)
    recv (torch/distributed/distributed_c10d.py:2799)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    main (hang.py:6)
    <module> (hang.py:10)
"""

# a DataLoader's destructor hung inside the training loop: freeing, but inside the script
LOADER = """Thread 9 (idle): "MainThread"
    pthread_join (libc.so.6)
    _MultiProcessingDataLoaderIter.__del__ (torch/utils/data/dataloader.py:1479)
    train (train.py:40)
    main (train.py:61)
    <module> (train.py:70)
"""

# a global's destructor at interpreter shutdown: no module frame left
SHUTDOWN = """Thread 11 (idle): "MainThread"
    pthread_mutex_lock (libc.so.6)
    Deadlock.__del__ (train.py:12)
"""

GDB_SHUTDOWN = """Thread 1 (Thread 0x7e (LWP 10) "python3"):
#0  0x00007f in __futex_abstimed_wait_common () from /lib/libc.so.6
#1  0x00007f in std::thread::join() () from /lib/libstdc++.so.6
#2  0x00007f in c10d::ProcessGroupGloo::~ProcessGroupGloo() () from libtorch_cpu.so
#3  0x00007f in finalize_modules () from /lib/libpython3.11.so
#4  0x00007f in Py_FinalizeEx () from /lib/libpython3.11.so
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
    usages: dict,
    asked: list,
    clock: _Clock,
    bound: float = 5.0,
    done: bool = True,
    said: list | None = None,
    stack: str = COLLECTIVE,
    read: list | None = None,
) -> ExitWatch:
    def others_done() -> bool:
        asked.append(clock.now)
        return done

    def read_stack(pid: int) -> tuple[str, str]:
        (read if read is not None else []).append(clock.now)
        return stack, "py-spy"

    quiet = (said if said is not None else []).append
    usage = lambda p: usages["now"]  # noqa: E731
    return ExitWatch(
        [0, 1], lambda r: 7, bound, others_done, quiet=quiet, clock=clock, usage=usage, read_stack=read_stack
    )


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


def test_a_stack_past_the_scripts_code_is_one_freeing_what_main_left_or_shutting_down():
    assert left_script(MUTEX, "py-spy") and left_script(GLOO, "py-spy") and left_script(SHUTDOWN, "py-spy")
    assert left_script(GDB_SHUTDOWN, "gdb")
    assert not left_script(COLLECTIVE, "py-spy")  # inside the script: a hang, never stuck at exit
    assert not left_script(LOADER, "py-spy")  # a destructor, but called from the training loop
    assert not left_script(SPY, "py-spy")  # main() still on the stack: nothing tells
    assert not left_script(GDB, "gdb")  # gdb shows no Python frame: only shutdown tells
    assert not left_script("python3 waits in futex_do_wait", "proc") and not left_script("", "py-spy")


def test_a_round_none_of_whose_ranks_exited_is_judged_when_every_stack_is_past_the_script():
    clock, asked, read, usages = _Clock(), [], [], {"now": _usage()}
    watch = _watch(usages, asked, clock, stack=MUTEX, read=read)
    found = []
    while not found and clock.now < 120:
        found = watch.tick(frozenset(), ending=False)
        clock.now += 0.5
    assert found == (0, 1) and asked == [clock.now - 0.5], (found, asked)  # once every other node was done
    assert len(read) == 2 and read[0] >= 105.0, read  # each stack read once, after 5 s of nothing
    clock.now += 1.0
    stuck = watch.stuck(frozenset(), False, base_rank=4)  # as the runner asks: with their stacks, read once
    assert [(w.rank, w.past_script) for w in stuck] == [(4, True), (5, True)], stuck
    assert "after its script's code returned" in stuck[0].line(2) and "Deadlock.__del__" in stuck[0].blocked
    assert len(read) == 2, read


def test_a_round_hung_in_a_collective_is_never_judged_and_its_stacks_are_read_once_a_quiet_stretch():
    clock, asked, read, said, usages = _Clock(), [], [], [], {"now": _usage()}
    watch = _watch(usages, asked, clock, said=said, stack=COLLECTIVE, read=read)
    for step in range(60):
        if step == 40:
            usages["now"] = _usage(cpu=2.0)  # a beat of work: a new quiet stretch, read again
        assert watch.tick(frozenset(), ending=False) == ()
        clock.now += 0.5
    assert len(read) == 2 and not asked and not said, (read, asked, said)  # one rank inside the script tells
