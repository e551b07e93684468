"""Each round's workers under torchrun's ``etcd-v3`` handler bootstrap on a store of their own.

torch's agent shares one TCPStore across rounds (served by group rank 0's agent); after a worker's
failure the next round's workers read what the last round's wrote there -- its gloo addresses, its
counters -- and failed in ``connectFullMesh`` (connection refused) or waited, quiet, in
``init_process_group`` (``python bench/launchers.py`` kills a worker under each launcher). The handler
tells torch's agent not to share it (``rendezvous.torchrun.plugin._StorePerRound``). Shown here
without a race, under every torch CI runs: a worker of the round after a failure finds in the default
group's store nothing the last round's workers wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")

STORE_PROBE = str(Path(__file__).resolve().parent / "workers" / "round_store.py")
ENDS_WITHIN = 150  # seconds; 11 s here alone -- the bound is for a CI machine whose cores are all busy


@pytest.mark.timeout(ENDS_WITHIN + 60)  # the agents' logs are the story of a failure: the test's own bound comes first
def test_each_round_s_workers_bootstrap_on_a_store_without_the_last_round_s_keys(tmp_path, etcd_endpoints):
    run_id = f"round-store-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    args += ["--max-restarts", "1", "--monitor-interval", "0.1", "--rdzv-backend", "etcd-v3"]
    args += ["--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCH_DISABLE_SHARE"))}
    env["LOGLEVEL"] = "INFO"  # torchrun's rendezvous lines, for the story of a failure
    logs = [open(tmp_path / f"node{i}.log", "w") for i in (0, 1)]  # noqa: SIM115 -- closed below
    agents = [
        subprocess.Popen(
            [*args, STORE_PROBE, str(tmp_path)], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        for log in logs
    ]
    try:
        codes = [agent.wait(timeout=ENDS_WITHIN) for agent in agents]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
        for log in logs:
            log.close()
    said = "\n".join((tmp_path / f"node{i}.log").read_text()[-5000:] for i in (0, 1))
    seen = {path.name: path.read_text() for path in tmp_path.glob("seen-*")}
    print(f"\nwhat each worker found in its round's store: {seen}")
    assert codes == [0, 0], f"exit codes {codes} (None: not ended in {ENDS_WITHIN} s); found {seen}\n{said}"
    assert len(seen) == 4 and set(seen.values()) == {"none"}, f"{seen}\n{said}"
