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
from launcher.hangs.hangrules import FACTOR, FLOOR, HangTimeouts, RankWatch
from launcher.hangs.hangwatch import Starvation, run_delay


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
    from launcher.hangs import hangwatch

    real = hangwatch.run_delay
    hangwatch.run_delay = lambda pid: delays.get(pid)
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
        hangwatch.run_delay = real


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
