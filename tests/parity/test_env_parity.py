"""The workers' environment and the counting of --nproc-per-node, side by side with real torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.cli_helpers import tool

DUMP = (
    "import json, os, sys; "
    "json.dump(dict(os.environ), open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w'))"
)
# The whole environment is compared, name by name and value by value, except values that differ by
# nature (the job id, a free port, paths under each launcher's own directory) and the one the README's
# "Coming from torchrun" names: MASTER_ADDR under --standalone, torchrun's ``localhost`` and 127.0.0.1
# here (the same loopback, without a resolver that may answer ::1 first). TORCHELASTIC_USE_AGENT_STORE
# is True on both sides: each launcher's agent of group rank 0 hosts the store.
DIFFER_BY_NATURE = {"TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}
DIFFER_BY_DESIGN = {"MASTER_ADDR": ("localhost", "127.0.0.1")}
# Ours only, by design (README "Coming from torchrun"): the worker's heartbeat record for elastic.heartbeat()
# the agent's memory for elastic.checkpoint, and the agent's control socket for elastic.inprocess.
OURS_ONLY = {"ELASTIC_HEARTBEAT_FILE", "ELASTIC_CHECKPOINT_MEMORY", "ELASTIC_INPROCESS"}


def _launch(
    launcher: list[str], tmp_path, name: str, nproc: str, env: dict, prefix: list[str] = ()
) -> tuple[dict, str]:
    """Run ``launcher --standalone`` with a script that dumps each worker's environment; (rank -> env, stderr)."""
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")}
    result = subprocess.run(
        [*prefix, *launcher, "--standalone", "--nproc-per-node", nproc, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}, result.stderr


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.parametrize(
    "nproc, env", [("1", {}), ("2", {}), ("2", {"OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})]
)
def test_the_worker_environment_matches_torchruns(tmp_path, nproc, env):
    theirs, their_err = _launch(TORCHRUN, tmp_path, "torchrun", nproc, env)
    ours, our_err = _launch([tool("elastic-run")], tmp_path, "ours", nproc, env)
    assert sorted(ours) == sorted(theirs)
    for rank in theirs:
        assert set(ours[rank]) >= OURS_ONLY, rank
        mine = {k: v for k, v in ours[rank].items() if k not in OURS_ONLY}
        assert sorted(mine) == sorted(theirs[rank]), (rank, set(mine) ^ set(theirs[rank]))
        differ = {k for k in theirs[rank] if ours[rank][k] != theirs[rank][k]}
        assert differ <= DIFFER_BY_NATURE | set(DIFFER_BY_DESIGN), {k: (theirs[rank][k], ours[rank][k]) for k in differ}
        for name, (torchs, mine) in DIFFER_BY_DESIGN.items():
            assert (theirs[rank][name], ours[rank][name]) == (torchs, mine), name
    warned = "Setting OMP_NUM_THREADS environment variable for each process to be 1"
    assert (warned in our_err) == (warned in their_err)


def test_auto_counts_the_cpus_this_process_may_run_on_as_torchrun(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs to restrict one away")
    theirs, _ = _launch(TORCHRUN, tmp_path, "torchrun", "auto", {}, prefix=["taskset", "-c", "0"])
    ours, _ = _launch([tool("elastic-run")], tmp_path, "ours", "auto", {}, prefix=["taskset", "-c", "0"])
    assert len(ours) == len(theirs) == 1


@pytest.mark.parametrize("conf", ["bogus=1", "'join_timeout=5,last_call_timeout=1,timeout=5'"])
def test_rdzv_conf_strings_torchrun_runs_with_elastic_run_runs_with(tmp_path, conf):
    script = tmp_path / "ok.py"
    script.write_text("print('ok')")
    results = {}
    for name, launcher in (("torchrun", TORCHRUN), ("ours", [tool("elastic-run")])):
        results[name] = subprocess.run(
            [*launcher, "--standalone", "--nproc-per-node", "1", f"--rdzv-conf={conf}", str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert results["torchrun"].returncode == 0, results["torchrun"].stderr
    assert results["ours"].returncode == 0, results["ours"].stderr
    warned = [line for line in results["ours"].stderr.splitlines() if "unknown --rdzv-conf key" in line]
    assert len(warned) == (1 if conf == "bogus=1" else 0), results["ours"].stderr


def test_standalone_ignores_the_rendezvous_options_as_torchrun_does(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ok')")
    args = [
        "--standalone",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:1",
        "--rdzv-id",
        "mine",
        str(script),
    ]
    theirs = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    ours = subprocess.run(
        [tool("elastic-run"), *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
    lines = [line for line in ours.stderr.splitlines() if "--standalone: ignoring" in line]
    assert lines == [  # c10d is what --standalone runs on under torchrun too: not said as ignored
        "elastic-run: --standalone: ignoring --rdzv-endpoint, --rdzv-id; a local etcd is started for this job"
    ]


def test_auto_counts_only_gpus_that_exist_as_torchrun(tmp_path):
    if os.path.exists("/proc/driver/nvidia/gpus"):
        pytest.skip("this machine has GPUs: the case is a GPU-less one")
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    theirs, _ = _launch(TORCHRUN, tmp_path, "torchrun", "auto", env)
    ours, _ = _launch([tool("elastic-run")], tmp_path, "ours", "auto", env)
    assert len(ours) == len(theirs) == len(os.sched_getaffinity(0))


SAME_VALUES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "OMP_NUM_THREADS",
)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--nproc-per-node", "2"],
        ["--nproc_per_node=2"],
        ["--nnodes", "1", "--nproc-per-node", "2"],
        ["--nnodes=1:1", "--nproc-per-node=2", "--max-restarts", "1"],
    ],
)
def test_torchruns_single_node_commands_run_unchanged_under_both(tmp_path, args):
    """No --standalone and no endpoint: torchrun runs one node on its static rendezvous; elastic-run
    runs it on a local etcd, saying so in one line. The same ranks, the same torchrun variables."""
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MASTER_PORT", "MASTER_ADDR")}
    seen = {}
    for name, launcher in (("torchrun", TORCHRUN), ("ours", [tool("elastic-run")])):
        out = tmp_path / name
        out.mkdir()
        done = subprocess.run(
            [*launcher, *args, str(script), str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env=base,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (name, done.stderr[-2000:])
        seen[name] = ({p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}, done.stderr)
    (theirs, _), (ours, our_err) = seen["torchrun"], seen["ours"]
    assert sorted(ours) == sorted(theirs)
    for rank, env in theirs.items():
        assert {k: env.get(k) for k in SAME_VALUES} == {k: ours[rank].get(k) for k in SAME_VALUES}, rank
        assert ours[rank]["MASTER_ADDR"] and ours[rank]["MASTER_PORT"].isdigit()
    said = [line for line in our_err.splitlines() if "no --rdzv-endpoint and one node" in line]
    assert len(said) == 1, our_err
