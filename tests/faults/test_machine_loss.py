"""A machine lost while its round runs: killed whole (agent, reaper and workers SIGKILLed), frozen
whole (every process SIGSTOPped) or cut off from etcd and its peers (the loopback proxy). 3 agents
on a 3-member etcd, a real DDP script on gloo (``examples/ddp_steps.py``), ``--max-restarts 0``.

Each case: the survivors' agents end the lost node's lease through their probes within the
detection window, the round of 2 trains on, the job's restart count stays 0 (the job with no
restart to spare goes on), both survivors print one identical line naming the lost node, and no
worker of the lost node completes a step once the round without it started (split-brain window 0).
Woken, a frozen node's worker may end the step it was in (after a freeze the scheduler may run it
before its reaper), a step the round of 3 completed, and dies at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from rendezvous.etcd.ports import free_port
from tests.e2e.cli_helpers import tool

from .helpers import children, death_watch, freeze, run_id, stuck_story, thaw, timeline, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP = os.path.join(ROOT, "examples", "ddp_steps.py")
LOSS = re.compile(r"node (\S+) left the round \(agent gone or silent\): re-rendezvous, no restart used \(0/0\)")
DETECTION = 2.0  # seconds: the bound on noticing a lost machine, with the default peer_timeout (1.5)


def _steps(out: str, world: int) -> list[dict]:
    return [e for e in timeline(out) if e["event"] == "step" and e["world"] == world]


def _start(agents, endpoints: str, rid: str, out: str, conf: str = "") -> object:
    worker = [DDP, "--steps", "1000000", "--timeline", out]
    return agents(
        endpoints,
        rid,
        "2:3",
        out,
        120,
        ",".join(c for c in ("last_call_timeout=1", conf) if c),
        worker=worker,
        options=["--max-restarts", "0"],
    )


def _lost_node_case(started, lost, out: str, fault_at: float, rid: str, endpoints: str) -> tuple[float, float]:
    """What every case checks once its fault is in: returns seconds from the fault to the lost
    node's lease ended by its peers, and to the survivors' next step."""
    survivors = [a for a in started if a is not lost]
    # the round of 2 after the fault (under load the job may have begun with a round of 2 before the third node came)
    after = lambda: [e for e in _steps(out, 2) if e["t"] >= fault_at]  # noqa: E731
    wait_for(lambda: len(after()) >= 20, 40, what="the round of 2 to train on")
    first_step = min(e["t"] for e in after())
    lost_pids = set(children(lost.pid)) | {lost.pid}
    old = [e for e in timeline(out) if e["world"] == 3]
    new_start = min(e["t"] for e in timeline(out) if e["world"] == 2 and e["event"] == "started" and e["t"] >= fault_at)
    late = [e for e in old if e["event"] == "step" and e["pid"] in lost_pids and e["t"] >= new_start]
    assert not late, f"the lost node's worker stepped {len(late)} times after the round without it started"
    assert {e["restart"] for e in timeline(out) if e["world"] == 2} == {0}  # no restart used
    assert all(a.process.poll() is None for a in survivors), [a.output() for a in survivors]  # --max-restarts 0 goes on
    lines = [LOSS.search(a.output()) for a in survivors]
    assert all(lines), [a.output()[-3000:] for a in survivors]
    assert len({m.group(0) for m in lines}) == 1  # one identical line on every survivor
    history = subprocess.run(
        [tool("elastic-ctl"), "history", "--json", "--rdzv-endpoint", endpoints, "--rdzv-id", rid],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    records = [json.loads(line) for line in history.splitlines() if line.startswith("{")] or json.loads(history)
    ended = [r for r in records if r["kind"] == "node_lost" and r["node"] == lines[0].group(1)]
    assert ended, history  # its lease was ended by its watchers (not left to expire)
    assert not [r for r in records if r["kind"] == "group_restarted"], history
    return ended[0]["time"] - fault_at, first_step - fault_at


def _worker_of(out: str, agent) -> int:
    tree = set(children(agent.pid))
    return next(e["pid"] for e in timeline(out) if e["event"] == "started" and e["pid"] in tree)


def _three(agents, endpoints: str, rid: str, out: str, lost_endpoints: str = "", conf: str = "") -> list:
    started = [_start(agents, endpoints, rid, out) for _ in range(2)]
    started.append(_start(agents, lost_endpoints or endpoints, rid, out, conf))
    wait_for(lambda: len(_steps(out, 3)) >= 30, 90, what="3 ranks training", story=lambda: stuck_story(out, started))
    return started


def test_a_machine_killed_whole_costs_no_restart_and_is_noticed_in_two_seconds(cluster, agents, tmp_path):
    out, rid = str(tmp_path), run_id()
    started = _three(agents, cluster.endpoints, rid, out)
    lost = started[2]
    tree = [lost.pid, *children(lost.pid)]
    for pid in tree:
        os.kill(pid, signal.SIGKILL)  # the machine dies: nobody of its own revokes its lease
    killed = time.time()
    noticed, seconds = _lost_node_case(started, lost, out, killed, rid, cluster.endpoints)
    print(f"\nmachine killed: lease ended by its peers {noticed:.2f} s after, the survivors' next step {seconds:.2f} s")
    assert noticed < 1.0  # its agent's probe connection closed with its process: no silence to wait out


def test_a_machine_frozen_whole_is_ended_by_its_peers_and_runs_no_new_step_when_it_wakes(cluster, agents, tmp_path):
    out, rid = str(tmp_path), run_id()
    started = _three(agents, cluster.endpoints, rid, out)
    lost = started[2]
    tree = [lost.pid, *children(lost.pid)]
    worker = _worker_of(out, lost)
    freeze(tree)
    frozen = time.time()
    try:
        noticed, seconds = _lost_node_case(started, lost, out, frozen, rid, cluster.endpoints)
    finally:
        died = death_watch(worker)
        thaw(tree)
    thawed = time.time()
    wait_for(lambda: died, 10, what="the woken node's worker to die")
    # Woken, the worker may run before its reaper does (the scheduler's pick after a freeze): it can
    # end the step it was in, whose all-reduce the round of 3 completed before the freeze, and no more.
    done = max(e["step"] for e in _steps(out, 3) if e["pid"] not in tree)
    woke = [e["step"] for e in timeline(out) if e["pid"] in tree and e["event"] == "step" and e["t"] >= thawed]
    assert all(step <= done for step in woke), (woke, done)
    assert died[0] - thawed < 0.5, died[0] - thawed  # its fence (the peers' deadline, long past) fired at once
    print(f"\nmachine frozen: lease ended by its peers {noticed:.2f} s after, the survivors' next step {seconds:.2f} s")
    assert noticed <= DETECTION


def test_a_machine_cut_off_from_etcd_and_its_peers_stops_its_workers_before_its_lease_is_ended(
    cluster, agents, via_proxies, proxies, tmp_path
):
    out, rid = str(tmp_path), run_id()
    endpoints, links = via_proxies()
    probe_port = free_port()
    probe = proxies("127.0.0.1", probe_port)
    conf = f"probe_port={probe_port},probe_addr={probe.endpoint}"
    started = _three(agents, cluster.endpoints, rid, out, lost_endpoints=endpoints, conf=conf)
    lost = started[2]
    died = death_watch(_worker_of(out, lost))
    for link in [*links, probe]:
        link.cut()
    cut = time.time()
    noticed, seconds = _lost_node_case(started, lost, out, cut, rid, cluster.endpoints)
    assert died and died[0] - cut < noticed, (died, noticed)  # its workers were gone before its lease was ended
    print(f"\ncut off: its own worker killed {died[0] - cut:.2f} s after the cut")
    print(
        f"\nmachine cut off: lease ended by its peers {noticed:.2f} s after, the survivors' next step {seconds:.2f} s"
    )
    assert "no peer acknowledged this node's probe answers" in lost.output(), lost.output()[-3000:]
    assert noticed <= DETECTION
