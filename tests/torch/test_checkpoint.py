"""elastic.checkpoint under elastic-run: a worker's saves live in memory its agent owns, so a
restarted worker loads them in milliseconds; copies go to --checkpoint-dir; nothing is left in
shared memory when the agent ends, or is killed."""

from __future__ import annotations

import glob
import os
import signal
import time

import torch

from tests.e2e.cli_helpers import agent_args, finish, json_records, run, run_id, start, wait_for

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "ckpt_steps.py")


def _by_attempt(out: str) -> dict[tuple[int, int], dict]:
    return {(r["attempt"], r["rank"]): r for r in json_records(out, "*.json", "rank")}


def test_a_killed_worker_comes_back_with_its_last_save_from_the_agents_memory(tmp_path):
    out, disk = tmp_path / "out", tmp_path / "disk"
    out.mkdir()
    done = run(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--checkpoint-dir", str(disk)]
        + ["--checkpoint-every", "100", WORKER, str(out), "12", "1", "6"],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _by_attempt(str(out))
    assert seen[(0, 0)]["loaded"] is None and seen[(0, 1)]["loaded"] is None
    # rank 1 died right after saving step 6; rank 0 was stopped somewhere after its own save
    assert seen[(1, 1)]["loaded"] == {"step": 6, "value": 601.0}, seen[(1, 1)]
    assert seen[(1, 0)]["loaded"] is not None and seen[(1, 0)]["loaded"]["value"] % 100 == 0
    print(f"\nloads after the restart: {seen[(1, 0)]['load_s'] * 1000:.1f} ms, {seen[(1, 1)]['load_s'] * 1000:.1f} ms")
    assert max(seen[(1, 0)]["load_s"], seen[(1, 1)]["load_s"]) < 0.5
    # on disk, the newest of each rank, written at the end (no rank saved 100 times), read back with weights_only
    assert sorted(os.listdir(disk)) == ["rank-0-step-11.pt", "rank-1-step-11.pt"]
    final = torch.load(disk / "rank-1-step-11.pt", weights_only=True)
    assert final["step"] == 11 and final["note"] == "rank 1" and float(final["weights"][0]) == 1101.0
    # a new job (a new node: no memory of it) on the same directory starts from the disk's copies
    again = tmp_path / "again"
    again.mkdir()
    done = run(["--standalone", "--nproc-per-node", "2", "--checkpoint-dir", str(disk), WORKER, str(again), "13"])
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = _by_attempt(str(again))
    assert resumed[(0, 0)]["loaded"] == {"step": 11, "value": 1100.0} and resumed[(0, 1)]["loaded"]["step"] == 11
    memory = seen[(0, 0)]["memory"]
    assert memory.startswith(("/dev/shm/elastic-ckpt-", "/tmp/elastic-ckpt-")), memory
    assert not os.path.exists(memory)  # freed when the agent ended


def test_copies_reach_the_disk_while_the_job_runs_and_a_killed_agent_leaves_no_shared_memory(tmp_path):
    out, disk = tmp_path / "out", tmp_path / "disk"
    out.mkdir()
    args = ["--standalone", "--nproc-per-node", "1", "--checkpoint-dir", str(disk), "--checkpoint-every", "5"]
    agent = start(args + [WORKER, str(out), "100000"])
    try:
        (record,) = wait_for(lambda: json_records(str(out), "*.json", "rank"), 60, what="the worker's start")
        memory = record["memory"]
        wait_for(lambda: os.path.isdir(disk) and os.listdir(disk), 30, what="a copy on disk every 5 saves")
        copies = [name for name in os.listdir(memory) if name.endswith(".pt")]
        assert len(copies) <= 2, copies  # at most two per rank in memory (the newest, one being written)
        agent.send_signal(signal.SIGKILL)
        wait_for(lambda: not os.path.exists(memory), 15, what="the reaper to free the agent's memory")
    finally:
        agent.kill()
        finish(agent, timeout=30)


def test_a_node_that_lost_its_memory_gets_the_newest_replicated_state_from_a_survivor(etcd_endpoints, tmp_path):
    """Two agents, one worker each, DDP-like state; node B is killed outright (its reaper frees
    its memory), a fresh node C takes its place: C's worker has no copy and receives rank 0's."""
    out = tmp_path / "out"
    out.mkdir()
    rid = run_id()
    args = agent_args(etcd_endpoints, rid, "2", nproc=1) + ["--max-restarts", "0"]
    worker = [WORKER, str(out), "400", "-1", "-1", "replicated"]
    a, b = start(args + worker), start(args + worker)
    c = None
    try:
        wait_for(lambda: len(glob.glob(str(out / "0-*.json"))) == 2, 90, what="both workers of round 1")
        time.sleep(1.0)  # some saves
        victim = b if _rank_of(out, b) == 1 else a
        victim.send_signal(signal.SIGKILL)
        c = start(args + worker)
        survivor = a if victim is b else b
        code_s, said_s = finish(survivor, timeout=150)
        code_c, said_c = finish(c, timeout=60)
        assert (code_s, code_c) == (0, 0), said_s[-3000:] + said_c[-3000:]
    finally:
        for agent in (a, b, c):
            if agent is not None and agent.poll() is None:
                agent.kill()
    later = [r for r in json_records(str(out), "*.json", "rank") if r["attempt"] > 0 or r["loaded"] is not None]
    assert len(later) == 2 and all(r["loaded"] is not None for r in later), later
    assert len({r["loaded"]["step"] for r in later}) == 1  # both ranks resume from the same step
    print(f"\nresumed at step {later[0]['loaded']['step']} on both ranks")
    assert later[0]["loaded"]["step"] > 0


def _rank_of(out, agent) -> int:
    for record in json_records(str(out), "0-*.json", "rank"):
        if _is_child(record["pid"], agent.pid):
            return record["rank"]
    return -1


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return ppid == parent or (ppid > 1 and _is_child(ppid, parent))


def _save_steps(steps: int):
    """A function worker keeping its state with elastic.checkpoint; returns the step it resumed from."""
    import torch

    import elastic.checkpoint as ckpt

    state = ckpt.load()
    for step in range(0 if state is None else state["step"] + 1, steps):
        ckpt.save({"weights": torch.ones(4) * step, "step": step}, step=step)
    return None if state is None else state["step"]


def test_the_launch_api_takes_a_checkpoint_directory(tmp_path):
    import pytest

    from elastic import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts=0, checkpoint_dir=str(tmp_path))
    assert elastic_launch(config, _save_steps)(5) == {0: None, 1: None}
    assert sorted(os.listdir(tmp_path)) == ["rank-0-step-4.pt", "rank-1-step-4.pt"]
    assert elastic_launch(config, _save_steps)(7) == {0: 4, 1: 4}  # a new job on that directory resumes
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 1"):
        elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, checkpoint_every=0), _save_steps)(1)
