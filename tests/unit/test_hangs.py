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
