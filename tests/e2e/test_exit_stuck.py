"""Every run ends, even when a worker deadlocks as its script ends (PyTorch's own teardown deadlock,
simulated deterministically: ``workers/tutorial_ddp.py --stuck-rank``, a DDP script shaped like the
tutorial whose kept object locks a mutex twice with the GIL held as ``main()`` returns). The script
keeps its DDP model to the end of ``main()`` as the tutorial does, so PyTorch's real deadlock may
strike any rank as well (on a busy machine): the tests accept such a rank named too -- its stack is
gloo's process group's destructor -- as the launcher must.

Real agents, real etcd, real torch: the stuck rank is named with its native stack, recorded in the
history and ended, and every agent exits 0; a rank that works on after the others left (a large
save) is never judged stuck; the exit barrier of a node whose peer never finishes is bounded."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from .cli_helpers import HERE, agent_args, finish, run, run_id, start, wait_for, wait_joined

TUTORIAL = os.path.join(HERE, "workers", "tutorial_ddp.py")
LINGERING = os.path.join(HERE, "workers", "lingering.py")
STUCK_LINE = "is stuck at exit: alive"

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _torch():
    pytest.importorskip("torch")


def _history(endpoints: str, rdzv_id: str) -> list[dict]:
    shown = run(["history", "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


REAL = "ProcessGroupGloo"  # PyTorch's own teardown deadlock, in a named rank's native stack


def _named(records: list[dict], simulated: set[int]) -> None:
    """The ranks named stuck at exit: every simulated one, with its mutex; any other only in PyTorch's
    own deadlock (gloo's destructor), which a busy machine may bring to any rank of this script."""
    stuck = [r for r in records if r["kind"] == "worker_stuck_at_exit"]
    assert simulated <= {r["rank"] for r in stuck}, stuck
    for record in stuck:
        mine = record["rank"] in simulated and "pthread_mutex_lock" in record["stack"]
        assert mine or REAL in record["stack"], record


def _finish_all(agents: list) -> list[tuple[int, str]]:
    """Each agent's exit code and output (100 s each); every agent killed if one does not exit."""
    try:
        return [finish(agent, 100) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(timeout=30)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_rank_deadlocked_as_main_returns_is_named_with_its_stack_ended_and_the_job_succeeds(etcd_endpoints, tmp_path):
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "1", nproc=2), "--exit-stuck-timeout", "3"]
    began = time.monotonic()
    code, output = finish(start([*args, TUTORIAL, "--stuck-rank", "1", "--out", str(tmp_path)]), 90)
    took = time.monotonic() - began
    assert code == 0, output[-3000:]
    line = next((x for x in output.splitlines() if f"rank 1 {STUCK_LINE}" in x), "")
    assert line.startswith("elastic-run: rank 1 is stuck at exit"), output[-3000:]
    simulated = "pthread_mutex_lock" in line and "Deadlock.__del__" in line  # its native and Python frames
    assert simulated or REAL in line, line  # (PyTorch's own deadlock may take it first, as main()'s DDP model is freed)
    assert "[rank 1] training done" in output and "[rank 0] training done" in output, output[-3000:]
    records = _history(etcd_endpoints, rdzv_id)
    _named(records, {1})
    stuck = next(r for r in records if r["kind"] == "worker_stuck_at_exit" and r["rank"] == 1)
    assert stuck["quiet"] >= 3 and _gone(stuck["pid"]), f"the stuck worker {stuck} outlived its agent"
    assert took < 60, f"the job took {took:.1f} s to end"


@pytest.mark.timeout(240)  # two agents' waits of 100 s: a failure shows their lines and stacks
@pytest.mark.parametrize("stuck_rank", [0, 1], ids=["on the first node", "on the second node"])
def test_on_two_nodes_a_rank_stuck_at_exit_is_ended_and_both_agents_exit_0(etcd_endpoints, tmp_path, stuck_rank):
    """The first node keeps the round (it knows the others finished from its watch); the second
    asks etcd once."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "2", nproc=1), "--exit-stuck-timeout", "3"]
    worker = [TUTORIAL, "--stuck-rank", str(stuck_rank), "--out", str(tmp_path)]
    first = start([*args, *worker])
    wait_joined(etcd_endpoints, rdzv_id, 1)  # the first node takes group rank 0: global rank 0
    agents = [first, start([*args, *worker])]
    results = _finish_all(agents)
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0], [text[-3000:] for text in outputs]
    named = [i for i, text in enumerate(outputs) if f"rank {stuck_rank} {STUCK_LINE}" in text]
    assert named == [stuck_rank], [text[-2000:] for text in outputs]
    records = _history(etcd_endpoints, rdzv_id)
    _named(records, {stuck_rank})
    assert "job_closed" in [r["kind"] for r in records], records


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stuck", ["1,3", "0,1,3"], ids=["one a node", "all of the first node's"])
def test_ranks_stuck_on_two_nodes_at_once_are_both_ended_and_both_agents_exit_0(etcd_endpoints, tmp_path, stuck):
    """Neither node finishes by itself: each says its live ranks went quiet at exit, and each judges
    its own once every other node is finished or quiet -- also a node none of whose ranks exited (it
    hears from the other's quiet that a rank exited 0: the job is ending)."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "2", nproc=2), "--exit-stuck-timeout", "3"]
    worker = [TUTORIAL, "--stuck-rank", stuck, "--out", str(tmp_path)]
    first = start([*args, *worker])
    wait_joined(etcd_endpoints, rdzv_id, 1)  # ranks 0 and 1 here, 2 and 3 on the second node
    agents = [first, start([*args, *worker])]
    results = _finish_all(agents)
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0], [text[-3000:] for text in outputs]
    assert f"rank 1 {STUCK_LINE}" in outputs[0] and f"rank 3 {STUCK_LINE}" in outputs[1], [t[-2000:] for t in outputs]
    records = _history(etcd_endpoints, rdzv_id)
    _named(records, {int(r) for r in stuck.split(",")})
    assert "job_closed" in [r["kind"] for r in records], records


@pytest.mark.timeout(240)
@pytest.mark.parametrize("beats", [False, True], ids=["no heartbeats", "heartbeats each step"])
@pytest.mark.parametrize("nnodes, nproc", [(1, 2), (2, 1)], ids=["one node", "two nodes"])
def test_a_round_every_rank_of_which_is_stuck_at_exit_ends_and_succeeds(etcd_endpoints, tmp_path, nnodes, nproc, beats):
    """No rank exits 0: each node reads its quiet ranks' stacks, finds them past the script's code
    (freeing main()'s locals at the module's top level), says so, and ends them once every node has.
    With a heartbeat each fast step, the hang watch learns a timeout of about a second and suspects
    the quiet ranks long before the exit watch's 3 s: their stacks set them aside, never a hang."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, str(nnodes), nproc=nproc), "--exit-stuck-timeout", "3"]
    worker = [TUTORIAL, "--stuck-rank", "0,1", "--out", str(tmp_path), *(["--beats"] if beats else [])]
    agents = [start([*args, *worker])]
    if nnodes == 2:
        wait_joined(etcd_endpoints, rdzv_id, 1)
        agents.append(start([*args, *worker]))
    results = _finish_all(agents)
    outputs = "\n".join(text for _, text in results)
    assert [code for code, _ in results] == [0] * nnodes, [text[-3000:] for _, text in results]
    for rank in (0, 1):
        line = next((x for x in outputs.splitlines() if f"rank {rank} {STUCK_LINE}" in x), "")
        assert "after its script's code returned" in line, outputs[-3000:]
        assert "pthread_mutex_lock" in line or REAL in line, line  # PyTorch's own deadlock may come first
    records = _history(etcd_endpoints, rdzv_id)
    _named(records, {0, 1})
    assert all(r["past_script"] for r in records if r["kind"] == "worker_stuck_at_exit"), records
    assert "job_closed" in [r["kind"] for r in records], records
    assert "worker_hung" not in [r["kind"] for r in records] and " hung: " not in outputs, outputs[-3000:]


def test_a_round_hung_in_a_collective_is_never_judged_stuck_at_exit(etcd_endpoints, tmp_path):
    """Every rank waits inside main() for a message never sent: as quiet as a rank stuck at exit, and
    no rank exited, but its stack is in the script: a hang, left alone by this rule, however long."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "1", nproc=2), "--exit-stuck-timeout", "1"]
    agent = start([*args, TUTORIAL, "--hang-in-recv", "--out", str(tmp_path)])
    try:
        waits = [tmp_path / f"{rank}-waits.json" for rank in (0, 1)]
        wait_for(lambda: all(os.path.exists(p) for p in waits), 90, what="both ranks waiting in recv")
        time.sleep(12)  # twelve bounds: each rank's stack read, found inside main()
        assert agent.poll() is None, "the agent ended a job hung in a collective"
    finally:
        agent.terminate()
        code, output = finish(agent, 60)
    assert STUCK_LINE not in output, output[-3000:]
    assert "[rank 0] training done" not in output, output[-3000:]


def test_a_rank_that_saves_after_the_others_left_is_never_judged_stuck(etcd_endpoints, tmp_path):
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "1", nproc=2), "--exit-stuck-timeout", "1"]
    worker = [TUTORIAL, "--save-seconds", "5", "--out", str(tmp_path)]
    code, output = finish(start([*args, *worker]), 90)
    assert code == 0, output[-3000:]
    assert f"rank 0 {STUCK_LINE}" not in output, output[-3000:]  # (rank 1 may meet PyTorch's deadlock)
    assert os.path.exists(tmp_path / "0-0.json"), "rank 0 did not end its save"  # written after the save
    assert os.path.getsize(tmp_path / "final.bin") > 1 << 20


@pytest.mark.timeout(240)
def test_an_idle_rank_is_not_judged_while_a_rank_on_another_node_still_works(etcd_endpoints, tmp_path):
    """Rank 3 sits idle on the second node after its peer there exited, while rank 0 on the first
    node still saves: not every other rank has exited, so rank 3 is not stuck, however idle."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "2", nproc=2), "--exit-stuck-timeout", "1"]
    worker = [TUTORIAL, "--save-seconds", "6", "--linger-rank", "3", "--linger", "3", "--out", str(tmp_path)]
    first = start([*args, *worker])
    wait_joined(etcd_endpoints, rdzv_id, 1)  # the first node: ranks 0 and 1
    agents = [first, start([*args, *worker])]
    results = _finish_all(agents)
    assert [code for code, _ in results] == [0, 0], [text[-3000:] for _, text in results]
    # (PyTorch's own teardown deadlock may still strike another rank here, and be named: not rank 3)
    assert not any(f"rank 3 {STUCK_LINE}" in text for _, text in results), [text[-3000:] for _, text in results]
    assert os.path.exists(tmp_path / "3-0.json"), "rank 3 did not end by itself"


def test_the_exit_barrier_is_bounded_and_names_the_nodes_still_running(etcd_endpoints, tmp_path):
    """A node whose workers succeeded waits --exit-barrier-timeout for a node whose rank works on
    (a CPU loop: never stuck), says which node still runs, and exits 0."""
    rdzv_id = run_id()
    args = [*agent_args(etcd_endpoints, rdzv_id, "2", nproc=1), "--exit-barrier-timeout", "4"]
    worker = [LINGERING, "1", "120"]
    first = start([*args, *worker])
    wait_joined(etcd_endpoints, rdzv_id, 1)
    second = start([*args, "--shutdown-timeout", "2", *worker])
    try:
        code, output = finish(first, 90)
        assert code == 0, output[-3000:]
        line = next((x for x in output.splitlines() if "exit barrier timed out" in x), "")
        assert "after 4 s: nodes still running their workers: " in line, output[-3000:]
        assert "none that etcd names" not in line, line
        assert second.poll() is None, "the node whose rank works on ended"
    finally:
        second.terminate()
        finish(second, 60)
