"""A stop signal (SIGTERM from a kubelet, Ctrl-C) that comes while the agent starts its workers: the
start finishes, then the agent stops, so every worker it started is one it stops with the grace --
none is left unknown to its group, to be killed unwarned when the agent exits."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from launcher.errors import AgentStopped
from launcher.output import LogPump
from launcher.output.default import DefaultLayout
from launcher.signals import stop_deferred, stop_on_signals
from launcher.warmstart.starters import PlainStart, starter_for
from launcher.workers.env import WorkerSpec
from launcher.workers.group import WorkerGroup

WORKERS = 24


def _specs(tmp_path) -> list[WorkerSpec]:
    return [
        WorkerSpec(r, WORKERS, 0, WORKERS, 0, 1, "127.0.0.1", 29500, "job", 0, 0, str(tmp_path / f"e{r}.json"))
        for r in range(WORKERS)
    ]


def _signal_once_started(group: WorkerGroup, sent: list[float]) -> threading.Thread:
    """SIGTERM to this process as soon as the first worker runs: the rest are still being started."""

    def send() -> None:
        deadline = time.monotonic() + 30
        while not group.pids and time.monotonic() < deadline:
            time.sleep(0.0005)
        sent.append(len(group.pids))
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_stop_signal_while_workers_start_is_raised_once_every_started_worker_is_known(tmp_path):
    pump = LogPump()
    group = WorkerGroup(["sleep", "30"], pump, None, starter=PlainStart(lifeline=False))
    layout = DefaultLayout(str(tmp_path)).layout(
        0, role="default", base_rank=0, nproc=WORKERS, run_id="job", restart_count=0
    )
    sent: list[int] = []
    try:
        with pytest.raises(AgentStopped), stop_on_signals((signal.SIGTERM,)):
            sender = _signal_once_started(group, sent)
            with stop_deferred():
                group.start(_specs(tmp_path), layout, {"PATH": os.environ["PATH"]})
        sender.join(10)
        started = [p.pid for p in psutil.Process().children() if p.name() == "sleep"]
        print(f"\nSIGTERM came with {sent[0]} of {WORKERS} workers started; the group knows {len(group.pids)}")
        assert sent and sent[0] < WORKERS, "the signal came after the start: nothing was tested"
        assert sorted(group.pids) == sorted(started) and len(started) == WORKERS
    finally:
        group.stop(grace=5)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_outside_the_start_a_stop_signal_stops_the_agent_at_once():
    with pytest.raises(AgentStopped), stop_on_signals((signal.SIGTERM,)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # never reached in full: the handler raises in the sleep
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_warm_interpreter_that_died_after_saying_it_could_start_leaves_the_worker_to_a_plain_start(tmp_path):
    """The interpreter dies between ``can_start`` and the fork: the worker starts plainly and one
    line says warm starts are off (the start does not fail)."""
    from launcher.warmstart.interpreter import WarmStarter

    said: list[str] = []
    warm = WarmStarter(("json",), os.environ, said.append)
    assert warm.can_start()  # its imports are done
    os.kill(warm.pid, signal.SIGKILL)
    psutil.Process(warm.pid).wait(10)
    real, asked = warm.can_start, []
    warm.can_start = lambda: bool(asked.append(1)) or len(asked) == 1 or real()  # "yes", as just before it died
    pump = LogPump()
    group = WorkerGroup(["sleep", "30"], pump, None, starter=starter_for(warm, ["sleep", "30"], lifeline=False))
    layout = DefaultLayout(str(tmp_path)).layout(0, role="default", base_rank=0, nproc=1, run_id="job", restart_count=0)
    try:
        group.start(_specs(tmp_path)[:1], layout, {"PATH": os.environ["PATH"]})
        (pid,) = group.pids
        assert psutil.Process(pid).name() == "sleep" and psutil.Process(pid).ppid() == os.getpid()
        assert len(said) == 1 and said[0].startswith("warm start off: the warm interpreter exited"), said
    finally:
        group.stop(grace=5)
        warm.close()
