"""``elastic-ctl report`` on an unmodified DDP script (no heartbeat, no checkpoint: what most users
run), with and without a worker SIGKILLed: the account books the workers' lives as training and
only the time from the first worker's exit to the last as the stop, agrees with the workers' own
step times, says what it cannot know, and ``elastic-ctl status`` says nothing alarming of a job
that succeeded."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.e2e.cli_helpers import agent_args, finish, run_id, start, wait_for

from .test_report import _ctl, _timeline

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "plain_ddp.py")
STEPS, STEP_TIME, KILL_AT = 200, 0.03, 80
TEARDOWN = 3.0  # seconds an attempt's first worker may take from its last line to its exit, seen by its agent

pytestmark = pytest.mark.torch


def _job(endpoints: str, tmp, kill: bool) -> tuple[dict, list[dict], str]:
    pytest.importorskip("torch")
    steps_dir, rdzv_id = tmp / "timeline", run_id()
    steps_dir.mkdir()
    args = agent_args(endpoints, rdzv_id, "1", nproc=2) + ["--max-restarts", "1"]
    agent = start([*args, WORKER, "--steps", str(STEPS), "--step-time", str(STEP_TIME), "--timeline", str(steps_dir)])
    try:
        if kill:

            def victim():
                late = [r for r in _timeline(str(steps_dir)) if r["event"] == "step" and r["rank"] == 1]
                return late[-1]["pid"] if late and late[-1]["step"] >= KILL_AT else None

            os.kill(wait_for(victim, 90, interval=0.01, what=f"rank 1 at step {KILL_AT}"), signal.SIGKILL)
        code, output = finish(agent, 120)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert code == 0, output[-3000:]
    common = ["--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id]
    account = json.loads(_ctl("report", *common, "--json", "--no-html").stdout)
    status = _ctl("status", *common).stdout
    return account, _timeline(str(steps_dir)), status


def _lives(timeline: list[dict]) -> tuple[float, float]:
    """By the workers' own clocks: the seconds they stepped (each attempt's first step to its last,
    any rank), and their lives (each attempt's first process start to its first rank done -- or, in
    an attempt that ended in a fault, to its last step)."""
    stepped, lived = 0.0, 0.0
    for restart in {r["restart"] for r in timeline}:
        mine = [r for r in timeline if r["restart"] == restart]
        steps = [r["t"] for r in mine if r["event"] == "step"]
        done = [r["t"] for r in mine if r["event"] == "done"]
        stepped += max(steps) - min(steps)
        lived += (min(done) if done else max(steps)) - min(r["t0"] for r in mine if r["event"] == "started")
    return stepped, lived


@pytest.mark.parametrize("kill", [False, True], ids=["clean", "a worker SIGKILLed"])
def test_a_script_without_heartbeats_gets_an_account_of_its_workers_lives(etcd_endpoints, tmp_path, kill):
    account, timeline, status = _job(etcd_endpoints, tmp_path, kill)
    stepped, lived = _lives(timeline)
    training, stopping = account["productive"], account["lost"].get("stopping", 0.0)
    print(f"\ntraining {training:.2f} s by the account; by the workers' clocks {stepped:.2f} s of steps, "
          f"{lived:.2f} s of lives; stopping {stopping:.2f} s of {account['wall']:.2f} s")  # fmt: skip
    # every step is training, and the workers' start (imports, init) too: their lives, up to the first
    # one's exit -- its interpreter's teardown after its last line (torch's: a second or two on a loaded
    # machine; 2.04 s once under the suite's load on 2 cores) and the agent's next look (0.1 s) come on
    # top. Booking the agents' rendezvous or the stop as training would add more (7.9 s seen under load).
    attempts = len({r["restart"] for r in timeline})
    assert stepped <= training and lived - 0.3 <= training <= lived + TEARDOWN * attempts, (training, stepped, lived)
    assert stopping < 0.1 * account["wall"], account["lost"]  # the stop: first exit to last, not the round
    assert account["goodput"] >= (lived - 0.3) / account["wall"], account  # at least the workers' lives (was 0 %)
    assert any("call no elastic.heartbeat()" in note for note in account["notes"]), account["notes"]
    assert "crash-loop" not in status and "no progress" not in status, status
