"""The store the agent hosts (launcher/c10dstore) side by side with torch's own TCPStore server:
torch's client makes every call it has against each, and gets the same answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.cli_helpers import agent_args, finish, json_records, run, run_id, start, wait_for, wait_joined

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _answers(kind: str) -> list:
    env = {**os.environ, "PYTHONPATH": ROOT}
    host = subprocess.Popen(
        [sys.executable, os.path.join(WORKERS, "store_host.py"), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = host.stdout.readline().strip()
        assert port, f"the {kind} store printed no port"
        done = subprocess.run(
            [sys.executable, os.path.join(WORKERS, "store_ops.py"), port],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        host.stdin.close()
        host.wait(timeout=10)


@pytest.mark.parametrize("kind", ["agent", "agent-late"])
def test_the_agents_store_answers_torchs_client_as_torchs_server_does(kind):
    theirs, ours = _answers("torch"), _answers(kind)
    print(f"\n{len(theirs)} calls, torch's server: {theirs}")
    assert ours == theirs


# -- under elastic-run: the agent of group rank 0 hosts each round's store -------------------------
INIT = os.path.join(WORKERS, "store_init.py")


def _attempts(out: str) -> dict[int, list[dict]]:
    by_attempt: dict[int, list[dict]] = {}
    for record in json_records(out, "*.json", "rank"):
        by_attempt.setdefault(record["attempt"], []).append(record)
    return by_attempt


def _init_after_last(records: list[dict]) -> float:
    """From the last rank's call of init_process_group to the end of everyone's, less what the rank
    that ended last waited for a CPU meanwhile (a loaded machine's, not the store's: a client's
    connect back-off is a sleep, and stays in)."""
    last = max(records, key=lambda r: r["end"])
    return last["end"] - max(r["start"] for r in records) - last["starved"]


def test_init_takes_milliseconds_in_any_start_order_and_each_round_has_a_fresh_store(etcd_endpoints, tmp_path):
    """Two agents, two workers each; rank 0 calls init_process_group 1 s after the others, and rank 1
    fails in attempt 0. With the store in rank 0's worker the others wait on its connect back-off
    (0.57-0.60 s seen); the agent's store is listening already."""
    out = str(tmp_path)
    args = agent_args(etcd_endpoints, run_id(), "2", nproc=2) + ["--max-restarts", "1", INIT, out, "1.0", "1"]
    agents = [start(args) for _ in range(2)]
    results = [finish(agent, timeout=150) for agent in agents]
    assert [code for code, _ in results] == [0, 0], "\n".join(output for _, output in results)
    attempts = _attempts(out)
    assert sorted(attempts) == [0, 1] and all(len(records) == 4 for records in attempts.values()), attempts
    for attempt, records in attempts.items():
        took = _init_after_last(records)
        print(f"\nattempt {attempt}: init_process_group done {took * 1000:.1f} ms after the last rank called it")
        assert {r["agent_store"] for r in records} == {"True"} and len({r["master"] for r in records}) == 1
        assert took < 0.45, records  # under the worker-hosted store's 0.57 s back-off (0.31 s once at -n 4)
        assert all(not r["earlier_keys"] for r in records), records  # no key of attempt 0 in attempt 1's store
    assert attempts[0][0]["master"] != attempts[1][0]["master"]  # a store of its own per round


def test_when_group_rank_0s_node_goes_the_next_rounds_rank_0_hosts_the_store(etcd_endpoints, tmp_path):
    """Three agents; the one of group rank 0 (the store's host) is killed while its round runs: the
    two left form a round whose new group rank 0 serves a store of its own, and the job finishes."""
    out = str(tmp_path)
    rdzv_id = run_id()
    # a last call of 8 s: the round of 3 forms even when a loaded machine starts the third agent late (with
    # 1 s, a round of 2 formed first, its workers finished, and the job ended before any round of 3)
    args = agent_args(etcd_endpoints, rdzv_id, "2:3", nproc=1) + ["--rdzv-conf", "last_call_timeout=8"]
    worker = [INIT, out, "0", "-1", "60", "3"]  # in the round of 3, every rank stays until the test acts
    first = start(args + worker)
    wait_joined(etcd_endpoints, rdzv_id, 1)  # it joins first: group rank 0
    others = [start(args + worker) for _ in range(2)]
    wait_for(lambda: len(json_records(out, "*.json", "rank")) == 3, 90, what="the round of 3")
    round_of_3 = json_records(out, "*.json", "rank")
    assert round_of_3[0]["master"].startswith("127.0.0.1:") and len({r["master"] for r in round_of_3}) == 1
    first.send_signal(signal.SIGKILL)  # its reaper revokes its lease and kills its worker
    results = [finish(agent, timeout=120) for agent in others]
    assert [code for code, _ in results] == [0, 0], "\n".join(output for _, output in results)
    round_of_2 = [r for r in json_records(out, "*.json", "rank") if r["world"] == 2]
    assert len(round_of_2) == 2 and len({r["master"] for r in round_of_2}) == 1, round_of_2
    assert round_of_2[0]["master"] != round_of_3[0]["master"]
    print(f"\nround of 2 after the master's node died: init {_init_after_last(round_of_2) * 1000:.1f} ms")
    assert _init_after_last(round_of_2) < 0.45  # as above: under a worker-hosted store's back-off


def test_torchs_opt_out_leaves_the_store_to_rank_0s_worker(tmp_path):
    """TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as torchrun honours it: the workers host the store."""
    out = str(tmp_path)
    done = run(
        ["--standalone", "--nproc-per-node", "2", INIT, out, "1.0"],
        timeout=120,
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = _attempts(out)[0]
    print(f"\nrank 0's worker hosting: init done {_init_after_last(records) * 1000:.1f} ms after the last call")
    assert {r["agent_store"] for r in records} == {"False"}
