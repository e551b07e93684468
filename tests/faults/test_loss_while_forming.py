"""A machine lost while the next round forms: a round of 2 trains (``--nnodes 2:3``), a third node
arrives, and at that moment one node of the round is killed whole or frozen whole. The round that
forms must not wait for the lost node's lease to expire (15 s): the lost node's peers of the last
round go on probing it until the next round has formed, end its lease, and the new round of the
survivor and the newcomer trains within a few seconds. Real agents, a 3-member etcd, a DDP script on
gloo, ``--max-restarts 0``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.e2e.cli_helpers import tool

from .helpers import children, freeze, run_id, stuck_story, thaw, timeline, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP = os.path.join(ROOT, "examples", "ddp_steps.py")
WITHIN = 6.0  # seconds from the fault to the new round's first step (the lease would take 15 s)
FORMED = 5.0  # seconds from the fault to the new round's freeze, when the newcomer's own start is not counted


def _start(agents, endpoints: str, rid: str, out: str, nnodes: str = "2:3"):
    worker = [DDP, "--steps", "1000000", "--timeline", out]
    return agents(
        endpoints, rid, nnodes, out, 120, "last_call_timeout=1", worker=worker, options=["--max-restarts", "0"]
    )


def _history(endpoints: str, rid: str) -> list[dict]:
    text = subprocess.run(
        [tool("elastic-ctl"), "history", "--json", "--rdzv-endpoint", endpoints, "--rdzv-id", rid],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return json.loads(text)


def _lose(lost, fault: str) -> list[int]:
    tree = [lost.pid, *children(lost.pid)]
    if fault == "killed":
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
    else:
        freeze(tree)
    return tree


def _two_train(out: str, started: list) -> None:
    """The round of 2 took 30 steps (CI once saw both workers stop before their first step for 90 s:
    the story then holds their stacks)."""
    two = lambda: sum(e["event"] == "step" and e["world"] == 2 for e in timeline(out)) >= 30  # noqa: E731
    wait_for(two, 90, what="2 ranks", story=lambda: stuck_story(out, started))


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_two_node_job_finds_its_lost_node_in_seconds_with_nobody_joining(cluster, agents, tmp_path, fault):
    """Each node is the other's only watcher: the survivor cannot tell "my peer is gone" from "I am
    cut off" by probes alone, and stops its workers when nobody acknowledges it (its fence); its
    probes of the lost node go on after that, end the lost node's lease, and its round of 1 trains."""
    out, rid = str(tmp_path), run_id()
    survivor, lost = [_start(agents, cluster.endpoints, rid, out, nnodes="1:3") for _ in range(2)]
    _two_train(out, [survivor, lost])
    tree = _lose(lost, fault)
    at = time.time()
    try:
        stepped = lambda: [e for e in timeline(out) if e["event"] == "step" and e["t"] > at and e["world"] == 1]  # noqa: E731
        wait_for(stepped, 30, what="the survivor's round of 1 to train")
        took = min(e["t"] for e in stepped()) - at
    finally:
        if fault == "frozen":
            thaw(tree)
    print(f"\ntwo-node job, node {fault}: the survivor's first step alone {took:.2f} s after the fault")
    assert took < WITHIN, f"the survivor's first step alone came {took:.1f} s after the fault"
    assert survivor.process.poll() is None
    assert [r for r in _history(cluster.endpoints, rid) if r["kind"] in ("node_lost", "node_left")]


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_node_lost_just_as_a_new_node_joins_costs_seconds_not_its_lease(cluster, agents, tmp_path, fault):
    out, rid = str(tmp_path), run_id()
    first = [_start(agents, cluster.endpoints, rid, out) for _ in range(2)]
    _two_train(out, first)
    survivor, lost = first
    tree = _lose(lost, fault)
    at = time.time()
    newcomer = _start(agents, cluster.endpoints, rid, out)
    try:
        ours = lambda: {survivor.pid, newcomer.pid, *children(survivor.pid), *children(newcomer.pid)}  # noqa: E731
        stepped = lambda: [  # noqa: E731
            e for e in timeline(out) if e["event"] == "step" and e["t"] > at and e["world"] == 2 and e["pid"] in ours()
        ]
        wait_for(lambda: len({e["rank"] for e in stepped()}) == 2, 60, what="the survivor and the newcomer to train")
        took = min(e["t"] for e in stepped()) - at
    finally:
        if fault == "frozen":
            thaw(tree)
    history = _history(cluster.endpoints, rid)
    formed = min(r["time"] for r in history if r["kind"] == "round_frozen" and r["time"] > at and r["nodes"] == 2) - at
    print(f"\nnode {fault} as a new node joined: the new round froze {formed:.2f} s and stepped {took:.2f} s after it")
    # The round's freeze is what the lost lease would hold up (15 s; with the peers' watch off it froze
    # after 15.1 s). The first step also waits for the newcomer's own start (its interpreter, its agent,
    # torch in its warm interpreter): seconds of CPU on a loaded machine -- 11.4 s once at -n 3, 15.7 s
    # once at -n 4 with the round frozen after 1.75 s, 15.3-16.3 s beside six busy loops, more than 30 s
    # once in CI -- so it is only required to come (within 60 s).
    assert formed < FORMED, f"the new round froze {formed:.1f} s after the fault (its first step after {took:.1f} s)"
    assert survivor.process.poll() is None and newcomer.process.poll() is None
    ended = [r for r in history if r["kind"] in ("node_lost", "node_left")]
    assert ended, "the lost node's departure was not recorded"
