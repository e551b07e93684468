"""A machine that dies whole (its agent, reaper and workers SIGKILLed at once) in a job without
peer probes (``peer_timeout=0``; with them, test_machine_loss.py): nothing revokes its lease, so its
node key lives until the lease runs out, and the next round waits for it. Every survivor's
progress line names the silent node and says when its lease runs out."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from tests.e2e.cli_helpers import tool, wait_joined

from .helpers import children, run_id, wait_for, workers

FRAGILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "fragile.py")
RESTART_ONCE = ["--max-restarts", "1"]
SILENT = re.compile(r"waiting for (\S+) \((?:the coordinator, )?silent: its lease runs out in (\d+) s\)")


@pytest.mark.parametrize("victim", ["the coordinator", "another node"])
def test_the_round_after_a_machine_dies_names_it_while_it_waits_for_its_lease(cluster, agents, tmp_path, victim):
    """The coordinator dead: nobody forms the round until its lease runs out, and each survivor
    finds it silent itself; another node dead: the coordinator finds it and tells everyone."""
    out = str(tmp_path)
    rid = run_id()
    endpoints = cluster.endpoints

    def agent():
        worker = [FRAGILE, out, "60"]
        return agents(
            endpoints, rid, "2:3", out, 60, "last_call_timeout=30,peer_timeout=0", worker=worker, options=RESTART_ONCE
        )

    first = agent()
    wait_joined(endpoints, rid, 1)  # it joins first: it holds the coordinator key
    started = [first, agent(), agent()]
    wait_for(lambda: len(workers(out)) == 3, 60, what="3 workers")
    dead = started[0] if victim == "the coordinator" else started[2]
    survivors = [a for a in started if a is not dead]
    tree = [dead.pid, *children(dead.pid)]
    for pid in tree:
        os.kill(pid, signal.SIGKILL)  # the machine dies: nobody revokes its lease
    killed = time.time()
    open(os.path.join(out, "peer-lost"), "w").close()  # the survivors' collectives break
    found = wait_for(
        lambda: [m for s in survivors if (m := SILENT.search(s.output()))],
        20,
        what="a progress line naming the silent node",
    )
    seen = time.time() - killed
    node, left = found[0].group(1), int(found[0].group(2))
    print(f"\n{victim} died: {found[0].group(0)!r} {seen:.1f} s after")
    assert 15 - seen - 2 <= left <= 15 - seen + 2, (left, seen)  # the 15 s lease, from the last renewal
    assert (victim == "the coordinator") == ("the coordinator, silent" in found[0].group(0))
    wait_for(lambda: all(SILENT.search(s.output()) for s in survivors), 10, what="both survivors to say it")
    assert {SILENT.search(s.output()).group(1) for s in survivors} == {node}
    wait_for(lambda: any(w["world_size"] == 2 for w in workers(out)), 30, what="the round of 2 once the lease ran out")
    history = subprocess.run(
        [tool("elastic-ctl"), "history", "--rdzv-endpoint", endpoints, "--rdzv-id", rid],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert re.search(rf"round formed .*; left: {re.escape(node)}\b", history), (
        history
    )  # the node it named is the lost one
