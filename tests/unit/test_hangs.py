"""Hang rules without etcd or workers: learning the steady timeout, which rank to blame, the line,
reading a stack dump; and the worker API writing its shared record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from launcher.hangs import beatfile as beats
from launcher.hangs.beatfile import Beat, BeatReader
from launcher.hangs.blame import Frame, at_top_level
from launcher.hangs.hangrules import FACTOR, FLOOR, IDLE, HangTimeouts, RankWatch
from launcher.hangs.hangwatch import HangWatch, WatchedWorker
from launcher.hangs.procstat import (
    LISTEN_AFTER,
    LISTEN_EVERY,
    SHARE,
    SLACK,
    Idleness,
    Starvation,
    Usage,
    is_stopped,
    quiet,
    run_delay,
    tree_usage,
)
from launcher.hangs.stacks import dump_stacks


def _beat(last: float, count: int, phase: str = "", changes: int = 0, timeout: float = 0.0) -> Beat:
    return Beat(True, last, count, phase, last if phase else 0.0, timeout, changes, 0, 1)


def _steps(watch: RankWatch, times: list[float]) -> None:
    for count, at in enumerate(times, 1):
        watch.feed(_beat(at, count))


def test_the_steady_timeout_is_learned_from_steps_after_the_warmup_never_below_the_floor():
    watch = RankWatch(0, 0.0, HangTimeouts())
    _steps(watch, [1.0, 31.0, 32.0, 33.0, 34.0, 35.0])  # the first interval (30 s: compilation) is not a step
    assert watch.learned is None  # 4 steps: still warming up
    watch.feed(_beat(36.5, 7))
    assert watch.learned == 5 * 1.5
    report = watch.report("n", now=40.0, wall_now=1040.0)
    assert (report.kind, report.timeout, report.silent, report.last) == ("step", 7.5, 3.5, 1036.5)
    fast = RankWatch(0, 0.0, HangTimeouts())
    _steps(fast, [0.2 * i for i in range(1, 10)])
    assert fast.learned == FLOOR


def test_the_first_heartbeat_seen_is_kept_for_the_goodput_account():
    watch = RankWatch(0, 0.0, HangTimeouts())
    watch.feed(Beat(False, 0.0, 0, "", 0.0, 0.0, 0, 0, 1))  # not attached yet: no first step
    assert watch.first is None
    _steps(watch, [2.5, 3.0, 3.5])
    assert watch.first == 2.5 and watch.beat.last == 3.5


def test_an_explicit_timeout_wins_and_until_learned_the_first_heartbeat_timeout_applies():
    watch = RankWatch(0, 0.0, HangTimeouts(first=60.0))
    watch.feed(_beat(1.0, 1))
    assert watch.report("n", 2.0, 2.0).timeout == 60.0
    given = RankWatch(0, 0.0, HangTimeouts(steady=3.0))
    given.feed(_beat(1.0, 1))
    assert given.report("n", 5.0, 5.0).overdue


def test_a_phase_has_its_own_timeout_and_its_intervals_are_not_steps():
    watch = RankWatch(0, 0.0, HangTimeouts(steady=2.0))
    _steps(watch, [1.0, 2.0, 3.0])
    watch.feed(_beat(3.1, 4, phase="checkpoint", changes=1, timeout=600.0))
    report = watch.report("n", 100.0, 100.0)
    assert (report.kind, report.phase, report.timeout, report.overdue) == ("phase", "checkpoint", 600.0, False)
    watch.feed(_beat(200.0, 5, changes=2))  # the phase ended: 97 s across it is not a step
    assert watch.slowest == 1.0
    assert watch.times.count == 1 and watch.times.median() == pytest.approx(1.0, rel=0.001)  # nor a step's time


def test_the_plain_steps_durations_are_kept_for_the_goodput_account():
    watch = RankWatch(0, 0.0, HangTimeouts())
    _steps(watch, [1.0, 31.0, 31.2, 31.4, 31.6, 32.6])  # the first interval (compilation) is not a step
    watch.feed(_beat(33.0, 9))  # one read finds three new heartbeats: three steps of their mean
    assert watch.times.count == 7
    assert watch.times.median() == pytest.approx(0.2, rel=0.001)  # the one slow step does not move it
    assert watch.times.healthy() == pytest.approx(1.0 / 6, rel=0.001)  # nor the healthy step: a stall


def test_a_round_s_progress_holds_its_workers_healthy_step_with_their_jitter_and_without_their_stalls(tmp_path):
    paths = [str(tmp_path / f"{rank}.beat") for rank in (0, 1)]
    for path in paths:
        beats.create(path)
    workers = [WatchedWorker(rank, rank, path, 0.0) for rank, path in enumerate(paths)]
    watch = HangWatch(workers, HangTimeouts(), lambda: None, node="n", nodes=1, judge_first=False)
    now, count = 1.0, 0
    for step in [0.05] * 60 + [0.07] * 40 + [0.5]:  # a healthy job's steps, one of them a stall
        now, count = now + step, count + 1
        for path in paths:  # each step of both workers read on its own, as the agent's ticks do
            with open(path, "r+b") as record:
                record.write(beats.HEADER.pack(beats.MAGIC, 0))
                record.seek(beats.BEAT_AT)
                record.write(beats.BEAT.pack(now, count))
                record.seek(beats.WORK_AT)  # its own work: 40 ms of each step, rank 1 a little slower
                record.write(beats.WORK.pack(count * (0.04 + 0.01 * path.endswith("1.beat")), count))
        watch.most_beats()
    work = watch.work()
    first, last, beaten, healthy = work.first, work.last, work.beats, work.healthy
    assert (first, last, beaten) == (1.05, now, 101)
    assert work.own == pytest.approx(101 * 0.05)  # the most one local worker timed: rank 1's
    # the steps after the first two beats (the first interval is not a step): 58 of 50 ms and 40 of 70 --
    # the jitter's mean, not their 50 ms median, and not the stall
    assert healthy == pytest.approx((58 * 0.05 + 40 * 0.07) / 98, rel=0.001)


def _write_beat(path: str, at: float, count: int) -> None:
    with open(path, "r+b") as record:
        record.write(beats.HEADER.pack(beats.MAGIC, 0))
        record.seek(beats.BEAT_AT)
        record.write(beats.BEAT.pack(at, count))


MODULE = Frame("/job/train.py", 97, "<module>", "main()")
DEL = Frame("/job/train.py", 20, "__del__", "self._lib.lock(self._mutex)")
MAIN = Frame("/job/train.py", 80, "main", "trainer.train()")
JOIN = Frame("/usr/lib/python3.11/threading.py", 1112, "join", "self._wait_for_tstate_lock()")


def test_a_main_thread_at_a_module_s_top_level_may_be_past_its_script_and_one_in_a_function_is_not():
    assert at_top_level([MODULE]) and at_top_level([DEL, MODULE])  # freeing main()'s locals as it returns
    assert not at_top_level([MAIN, MODULE]) and not at_top_level([DEL, MAIN, MODULE])  # inside main()
    assert not at_top_level([JOIN, DEL, MODULE])  # a destructor that calls on into a library: not told here
    assert not at_top_level([])  # no stack came


def test_a_rank_past_its_script_is_set_aside_as_if_exited_and_comes_back_if_it_beats_again(tmp_path):
    """Its peers are past their last step then: the finishing timeout applies to them."""
    paths = [str(tmp_path / f"{rank}.beat") for rank in (0, 1)]
    for path in paths:
        beats.create(path)
    clock = [0.0]
    asked: list[int] = []
    workers = [WatchedWorker(rank, rank, path, 0.0) for rank, path in enumerate(paths)]
    past = lambda local_rank: asked.append(local_rank) or local_rank == 0  # noqa: E731
    timeouts = HangTimeouts(steady=2.0)
    watch = HangWatch(
        workers, timeouts, lambda: None, node="n", nodes=1, judge_first=False, past_script=past, clock=lambda: clock[0]
    )
    for path in paths:
        _write_beat(path, 1.0, 10)
    watch.most_beats()
    clock[0] = 4.0
    assert [r.rank for r in watch.reports() if r.overdue] == [0, 1]
    watch.note_stacks({0: [MODULE], 1: [MAIN, MODULE]})
    assert asked == [0]  # rank 1 is inside main(): no native stack is read for it
    assert [(r.rank, r.kind) for r in watch.reports()] == [(1, "finishing")]  # rank 0 set aside
    assert not watch.reports()[0].overdue  # 3 s quiet, past the last step: FACTOR x 2 s
    _write_beat(paths[0], 4.5, 11)  # it beats again: the script was at its top level, not past it
    clock[0] = 5.0
    watch.most_beats()
    assert sorted(r.rank for r in watch.reports()) == [0, 1]


def test_once_the_job_is_finishing_the_timeout_grows_from_what_was_learned_never_to_the_first_one():
    watch = RankWatch(0, 0.0, HangTimeouts(first=600.0, steady=2.0))
    watch.feed(_beat(1.0, 1))
    assert watch.report("n", 10.0, 10.0).overdue
    finishing = watch.report("n", 10.0, 10.0, finishing=True)
    assert (finishing.timeout, finishing.phase, finishing.overdue) == (FACTOR * 2.0, "finishing", False)
    assert watch.report("n", 12.0, 12.0, finishing=True).overdue  # 11 s after its last heartbeat: found
    slow_tail = watch.report("n", 12.0, 12.0, finishing=True, tail=30.0)  # a finished worker took 30 s
    assert slow_tail.timeout == FACTOR * 30.0 and not slow_tail.overdue
    assert watch.report("n", 12.0, 12.0, finishing=True, tail=1000.0).timeout == 600.0  # never past the first
    warming = RankWatch(0, 0.0, HangTimeouts(first=600.0))
    warming.feed(_beat(1.0, 1))  # nothing learned yet: the job ends during its warm-up
    assert warming.report("n", 10.0, 10.0, finishing=True).timeout == 600.0


def test_a_worker_that_never_beat_is_not_judged_unless_the_first_timeout_applies_to_it():
    quiet = RankWatch(0, 0.0, HangTimeouts(first=10.0)).report("n", 1000.0, 1000.0)
    assert not quiet.judged and not quiet.overdue
    expected = RankWatch(0, 0.0, HangTimeouts(first=10.0), judge_first=True).report("n", 11.0, 11.0)
    assert expected.overdue and expected.kind == "first"


def test_time_a_starved_worker_could_not_run_is_not_silence_until_it_beats_again():
    watch = RankWatch(0, 0.0, HangTimeouts(steady=2.0))
    watch.feed(_beat(1.0, 1))
    watch.starve(1.5)  # waited for a CPU, or its agent's loop woke late
    report = watch.report("n", now=4.0, wall_now=104.0)
    assert (report.silent, report.last, report.overdue) == (1.5, 101.0, False)
    assert watch.report("n", now=4.6, wall_now=104.6).overdue  # past 2 s of silence it could have run in
    watch.feed(_beat(5.0, 2))
    assert watch.starved == 0.0 and watch.report("n", now=6.0, wall_now=106.0).silent == 1.0
    never = RankWatch(0, 0.0, HangTimeouts(first=3.0, judge_first=True))
    never.starve(2.0)
    assert not never.report("n", now=4.0, wall_now=4.0).overdue


def test_the_starvation_credit_is_the_wait_for_a_cpu_or_the_agents_late_loop_whichever_is_longer():
    clock = [0.0]
    delays = {0: 10.0}
    looks = Starvation(lambda rank: rank, interval=0.1, clock=lambda: clock[0])
    from launcher.hangs import procstat

    real = procstat.run_delay
    procstat.run_delay = lambda pid: delays.get(pid)
    try:
        assert looks.since_last_look([0, 1]) == {0: 0.0, 1: 0.0}  # the first look: nothing to compare with
        clock[0], delays[0] = 0.1, 10.8  # on time; rank 0 waited 0.8 s for a CPU
        assert looks.since_last_look([0, 1]) == pytest.approx({0: 0.8, 1: 0.0})
        clock[0] = 3.1  # the loop woke 2.7 s late (3 s after the last look, for 0.1 s + 0.2 s allowed)
        assert looks.since_last_look([0, 1]) == pytest.approx({0: 2.7, 1: 2.7})
        clock[0] = 5.0
        looks.looked()  # the look's own etcd calls took until 5.0: its time is not lateness
        clock[0] = 5.1
        assert looks.since_last_look([0, 1]) == {0: 0.0, 1: 0.0}
    finally:
        procstat.run_delay = real


def test_a_busy_process_on_a_loaded_cpu_shows_its_wait_for_a_cpu():
    """``/proc/PID/schedstat``'s run delay grows for a runnable process that shares one CPU."""
    script = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    spinners = [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", script]) for _ in range(3)]
    try:
        before = run_delay(spinners[0].pid)
        time.sleep(1.0)
        after = run_delay(spinners[0].pid)
    finally:
        for spinner in spinners:
            spinner.wait(10)
    assert before is not None and after is not None and after - before > 0.2
    assert run_delay(spinners[0].pid) is None  # reaped: nothing to read


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        HangTimeouts(steady=0)
    with pytest.raises(ValueError, match="positive"):
        HangTimeouts(first=float("nan"))


WORKER = textwrap.dedent("""
    import os, sys, time, elastic
    elastic.heartbeat()
    with elastic.phase("checkpoint", timeout=30):
        with elastic.phase("inner"):
            print(open(sys.argv[1] + ".inner", "w").write("x"))
            time.sleep(float(sys.argv[2]))
    elastic.heartbeat()
    child = os.fork()
    if child == 0:
        elastic.heartbeat()  # a forked child is not the rank: nothing written
        os._exit(0)
    os.waitpid(child, 0)
    open(sys.argv[1] + ".forked", "w").close()
    time.sleep(float(sys.argv[2]))
""")


def test_the_worker_api_writes_its_record_and_a_forked_child_does_not(tmp_path):
    record = str(tmp_path / "0.beat")
    beats.create(record)
    reader = BeatReader(record)
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    process = subprocess.Popen(
        [sys.executable, str(script), record, "1.0"], env={**os.environ, "ELASTIC_HEARTBEAT_FILE": record}
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(record + ".inner"):
        assert process.poll() is None and time.monotonic() < deadline
    inside = reader.read()
    while not os.path.exists(record + ".forked"):
        assert process.poll() is None and time.monotonic() < deadline
    forked = reader.read()
    assert process.wait(timeout=30) == 0
    after = reader.read()
    assert inside.attached and inside.phase == "inner" and inside.count == 3 and inside.phase_changes == 2
    assert forked.count == 6, "the forked child's heartbeat was written as the rank's"
    # at exit the worker enters "exiting" (teardown is judged by the long timeout); the child wrote nothing
    assert after.phase == "exiting" and after.count == 7 and after.phase_changes == 5 and after.pid == process.pid
    assert after.stack_signal in range(signal.SIGRTMAX - 5, signal.SIGRTMAX)


def test_the_api_does_nothing_outside_elastic_run_and_refuses_a_bad_phase():
    code = (
        "import elastic, time\nelastic.heartbeat()\nwith elastic.phase('x', timeout=5): pass\n"
        "try:\n    elastic.phase('', timeout=-1).__enter__()\nexcept ValueError as e: print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ELASTIC_HEARTBEAT_FILE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "a phase name is a non-empty string" in done.stdout


def test_a_stack_dump_never_takes_a_signal_the_program_handles(tmp_path):
    record = str(tmp_path / "0.beat")
    beats.create(record)
    code = (
        "import signal, elastic\nfirst = signal.SIGRTMAX - 1\n"
        "signal.signal(first, lambda *a: None)\nelastic.heartbeat()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "ELASTIC_HEARTBEAT_FILE": record}, timeout=30
    )
    assert done.returncode == 0
    taken = BeatReader(record).read().stack_signal
    assert taken != 0 and taken != signal.SIGRTMAX - 1


def test_a_worker_whose_processes_do_nothing_is_held_to_the_idle_floor_a_busy_one_to_the_floor():
    fast = RankWatch(0, 0.0, HangTimeouts())
    _steps(fast, [0.05 * i for i in range(1, 10)])  # 50 ms steps: learned 0.25 s, floored at FLOOR
    last = fast.beat.last
    assert fast.silence(last + 1.2) == pytest.approx(1.2)
    busy = fast.report("n", now=last + 1.2, wall_now=1.2)
    assert (busy.timeout, busy.overdue) == (FLOOR, False)
    fast.idle(IDLE - 0.01)  # not yet quiet for long enough
    assert fast.report("n", now=last + 1.2, wall_now=1.2).timeout == FLOOR
    fast.idle(IDLE)
    idle = fast.report("n", now=last + 1.2, wall_now=1.2)
    assert (idle.timeout, idle.overdue) == (IDLE, True)
    fast.feed(_beat(last + 1.3, 10))  # it beat: a new silence, not idle
    assert fast.idle_for == 0.0 and fast.report("n", now=last + 1.4, wall_now=1.4).timeout == fast.learned
    slow = RankWatch(0, 0.0, HangTimeouts())
    _steps(slow, [1.0 * i for i in range(1, 10)])  # 1 s steps: learned 5 s, idle or not
    slow.idle(3.0)
    assert slow.report("n", now=10.0, wall_now=10.0).timeout == FACTOR * 1.0


def test_the_idle_floor_applies_only_where_the_timeout_is_learned_in_steady_state():
    given = RankWatch(0, 0.0, HangTimeouts(steady=8.0))
    _steps(given, [0.05 * i for i in range(1, 10)])
    assert given.silence(5.0) == 0.0  # a timeout given is the user's word: no reads, no idle floor
    given.idle(5.0)
    assert given.report("n", now=5.0, wall_now=5.0).timeout == 8.0
    warming = RankWatch(0, 0.0, HangTimeouts(first=60.0))
    _steps(warming, [0.05, 0.1, 0.15])
    assert warming.silence(5.0) == 0.0
    phased = RankWatch(0, 0.0, HangTimeouts())
    _steps(phased, [0.05 * i for i in range(1, 10)])
    phased.feed(_beat(0.5, 10, phase="checkpoint", changes=1, timeout=30.0))
    assert phased.silence(5.0) == 0.0
    phased.idle(5.0)
    assert phased.report("n", now=5.0, wall_now=5.0).timeout == 30.0
    done = RankWatch(0, 0.0, HangTimeouts())
    _steps(done, [0.05 * i for i in range(1, 10)])
    done.idle(5.0)  # past the last step (a peer finished): work that may wait on files or peers
    assert done.report("n", now=5.0, wall_now=5.0, finishing=True).timeout == FACTOR * FLOOR


def _usage(pids=(1,), cpu=1.0, waited=0.0, chars=100, busy=False) -> Usage:
    return Usage(frozenset(pids), cpu, waited, chars, busy)


def test_a_process_tree_is_quiet_only_if_nothing_at_all_happened_in_it():
    before = _usage()
    assert quiet(before, _usage(cpu=1.0 + SLACK * 0.9), 0.0)  # clock ticks
    assert quiet(before, _usage(cpu=1.0 + SLACK + SHARE * 10 - 0.001), 10.0)  # a timer thread's share
    assert not quiet(before, _usage(cpu=1.1), 1.0)  # it computed
    assert not quiet(before, _usage(waited=0.1), 1.0)  # it wanted a CPU: starved, not idle
    assert not quiet(before, _usage(chars=101), 1.0)  # it read or wrote a byte (a socket, a pipe, a file)
    assert not quiet(before, _usage(busy=True), 1.0)  # running, or waiting for a disk
    assert not quiet(before, _usage(pids=(1, 2)), 1.0)  # a process came or went
    assert not quiet(before, _usage(cpu=0.5), 1.0)  # less than before: a child's time left with it


def test_idleness_counts_from_the_last_sign_of_life_and_forgets_a_worker_that_beat():
    clock, seen = [0.0], {0: _usage()}
    idle = Idleness(lambda rank: rank, clock=lambda: clock[0], usage=lambda pid: seen.get(pid))
    assert idle.idle_for(0, silent=LISTEN_AFTER / 2) == 0.0  # not silent long enough to be read
    clock[0] = 1.0
    assert idle.idle_for(0, silent=0.5) == 0.0  # the first read: quiet from now on, if nothing happens
    clock[0] = 2.0
    assert idle.idle_for(0, silent=1.5) == 1.0
    seen[0] = _usage(chars=200)  # it wrote its stacks when the watch asked: excused
    idle.excuse([0])
    clock[0] = 2.5
    assert idle.idle_for(0, silent=2.0) == 1.5
    seen[0] = _usage(cpu=2.0, chars=200)  # it computed: quiet from here
    clock[0] = 3.0
    assert idle.idle_for(0, silent=2.5) == 0.0
    clock[0] = 4.0
    assert idle.idle_for(0, silent=3.5) == 1.0
    assert idle.idle_for(0, silent=0.0) == 0.0  # it beat
    clock[0] = 5.0
    assert idle.idle_for(0, silent=0.5) == 0.0  # a new silence starts a new count
    assert idle.idle_for(1, silent=5.0) == 0.0  # its process is gone: nothing to read
    reads = []
    counted = Idleness(lambda rank: rank, clock=lambda: clock[0], usage=lambda pid: reads.append(pid) or _usage())
    assert [counted.idle_for(0, silent=1.0) for _ in range(3)] == [0.0] * 3 and len(reads) == 1  # one read ...
    clock[0] += LISTEN_EVERY
    assert counted.idle_for(0, silent=1.2) == pytest.approx(LISTEN_EVERY) and len(reads) == 2  # ... a LISTEN_EVERY


def test_a_sleeping_process_reads_as_quiet_a_spinning_or_stopped_one_is_told_apart():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # both past their interpreter's start
        first = {p.pid: tree_usage(p.pid) for p in (sleeper, spinner)}
        time.sleep(0.5)
        second = {p.pid: tree_usage(p.pid) for p in (sleeper, spinner)}
        assert quiet(first[sleeper.pid], second[sleeper.pid], 0.5)
        assert not quiet(first[spinner.pid], second[spinner.pid], 0.5)
        assert not is_stopped(spinner.pid)
        spinner.send_signal(signal.SIGSTOP)
        for _ in range(100):
            if is_stopped(spinner.pid):
                break
            time.sleep(0.01)
        assert is_stopped(spinner.pid)
    finally:
        for process in (sleeper, spinner):
            process.kill()
            process.wait(10)
    assert tree_usage(sleeper.pid) is None and not is_stopped(sleeper.pid)


def test_a_stopped_worker_is_not_waited_for_its_stacks(tmp_path):
    """A SIGSTOPped process cannot run faulthandler's handler: the look answers "" at once for it
    instead of waiting out its deadline (and never signals it)."""
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stopped.send_signal(signal.SIGSTOP)
        for _ in range(100):
            if is_stopped(stopped.pid):
                break
            time.sleep(0.01)

        class Reader:
            def read(self) -> Beat:
                return Beat(True, 1.0, 3, "", 0.0, 0.0, 0, signal.SIGUSR1, stopped.pid)

        record = tmp_path / "0.beat"
        open(beats.stacks_path(str(record)), "w").close()
        began = time.monotonic()
        found = dump_stacks([(0, str(record), Reader())], {0}, wait=3.0)
        took = time.monotonic() - began
    finally:
        stopped.kill()
        stopped.wait(10)
    assert found == {0: ""} and took < 0.5, (found, took)


def test_a_sleeping_worker_whose_child_computes_is_not_quiet():
    """A DataLoader's workers are the worker's children: their CPU time counts as the worker's."""
    spinner = "subprocess.Popen([sys.executable, '-c', 'while True: pass'])"
    script = f"import subprocess, sys, time\n{spinner}\ntime.sleep(30)\n"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        time.sleep(0.5)
        first = tree_usage(parent.pid)
        time.sleep(0.5)
        second = tree_usage(parent.pid)
    finally:
        for pid in sorted(second.pids if second else ()):
            if pid != parent.pid:
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait(10)
    assert len(first.pids) == 2 and not quiet(first, second, 0.5), (first, second)
