"""The examples, each under elastic-run with two agents on one etcd (gloo), and the torchrun plugin."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.e2e.cli_helpers import agent_args, finish, run, run_id, start, tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


def two_agents(endpoints: str, example: str, *script_args: str, nproc: int = 1, extra: tuple = ()) -> list[str]:
    rid = run_id()
    args = agent_args(endpoints, rid, "2", nproc=nproc) + list(extra) + [os.path.join(EXAMPLES, example), *script_args]
    agents = [start(args) for _ in range(2)]
    results = [finish(agent, timeout=150) for agent in agents]
    assert [code for code, _ in results] == [0, 0], "\n".join(out for _, out in results)
    return [out for _, out in results]


def test_is_launched_true_under_elastic_run_false_under_python(etcd_endpoints):
    outputs = "".join(two_agents(etcd_endpoints, "is_launched.py"))
    assert outputs.count("torch=True elastic=True") == 2
    plain = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "is_launched.py")],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")},
        timeout=60,
    )
    assert plain.stdout.strip() == "torch=False elastic=False"


def test_p2p_ring_over_two_nodes(etcd_endpoints):
    outputs = "".join(two_agents(etcd_endpoints, "p2p.py", nproc=2))
    for rank in range(4):
        assert f"rank {rank}: ring of 4 ok (3 rounds of isend/irecv)" in outputs


def test_rpc_remote_rref_is_owned_by_worker1(etcd_endpoints):
    outputs = "".join(two_agents(etcd_endpoints, "rpc_owner.py"))
    assert "rank 0: RRef owner worker1, to_here().sum() = 10" in outputs


def test_rpc_timeout_raises_runtime_error_and_the_program_goes_on(etcd_endpoints):
    outputs = "".join(two_agents(etcd_endpoints, "rpc_timeout.py"))
    assert "rank 0: slow call timed out as asked:" in outputs
    assert "rank 0: carried on after the timeout" in outputs


def test_ddp_loss_falls_and_a_crash_resumes_from_the_checkpoint(etcd_endpoints, tmp_path):
    checkpoint = str(tmp_path / "ckpt.pt")
    outputs = "".join(
        two_agents(
            etcd_endpoints,
            "ddp_train.py",
            "--checkpoint",
            checkpoint,
            "--crash-at-epoch",
            "3",
            extra=("--max-restarts", "1"),
        )
    )
    assert "simulated crash of rank 1 in epoch 3" in outputs
    assert "restarting the workers (1/1)" in outputs
    assert f"resumed from {checkpoint} at epoch 3" in outputs
    losses = {int(e): float(v) for e, v in re.findall(r"epoch (\d+)/6 loss ([0-9.]+)", outputs)}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]  # the same final epoch count as without the crash
    assert losses[6] < losses[3] < losses[1]


def test_standalone_ddp_prints_a_falling_loss():
    result = run(
        ["--standalone", "--nproc-per-node", "2", os.path.join(EXAMPLES, "ddp_train.py"), "--epochs", "4"], timeout=150
    )
    assert result.returncode == 0, result.stderr
    losses = [float(v) for v in re.findall(r"epoch \d+/4 loss ([0-9.]+)", result.stdout)]
    assert len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:]))


def test_summary_shows_the_traceback_from_torchs_record():
    result = run(["--standalone", "--nproc-per-node", "1", os.path.join(WORKERS, "torch_record.py")], timeout=120)
    assert result.returncode == 1
    assert 'error: KeyError: "raised under torch\'s @record"' in result.stderr
    assert "traceback (from the error file):" in result.stderr


def test_torchrun_understands_elastic_record():
    torchrun = tool("torchrun")
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "1", os.path.join(WORKERS, "elastic_record.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    # torchrun's root-cause block (ChildFailedError), not the worker's own uncaught traceback: it names
    # the error file elastic.record wrote and prints the traceback it read from there.
    root = result.stderr[result.stderr.index("Root Cause (first observed failure):") :]
    error_file = re.search(r"error_file: (.*)", root).group(1).strip()
    assert error_file != "<N/A>", root
    assert error_file.endswith("error.json"), root
    block = root[root.index("traceback : ") :]
    assert block.startswith("traceback : Traceback (most recent call last):"), root
    assert 'elastic_record.py", line' in block and "KeyError: 'raised under elastic.record'" in block, root


def test_torchrun_with_the_etcd_v3_plugin_runs_allreduce(etcd_endpoints):
    rid = run_id()
    args = [
        tool("torchrun"),
        "--rdzv-backend",
        "etcd-v3",
        "--rdzv-endpoint",
        etcd_endpoints,
        "--rdzv-id",
        rid,
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--local-addr",
        "127.0.0.1",
        "--rdzv-conf",
        "join_timeout=60",
        os.path.join(EXAMPLES, "allreduce.py"),
    ]
    agents = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = []
    for agent in agents:
        out, _ = agent.communicate(timeout=150)
        outputs.append(out)
        assert agent.returncode == 0, out
    text = "".join(outputs)
    sums = re.findall(r"rank (\d) of 4: all_reduce sum (\d+)", text)
    assert sorted(int(r) for r, _ in sums) == [0, 1, 2, 3]
    assert {s for _, s in sums} == {"10"}
    # torch's handler kept its state in our backend, under our key space
    from rendezvous import EtcdClient, EtcdRendezvousBackend

    with EtcdClient(etcd_endpoints) as client:
        assert EtcdRendezvousBackend(client, rid).get_state() is not None
