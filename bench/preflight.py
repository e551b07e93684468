"""The pre-flight check's cost: a job of N nodes with ``--preflight`` on this machine, for each N.

    python bench/preflight.py [--nodes 2,4,8]

For each N: N agents (``elastic-run``, one gloo worker each, ``tests/torch/workers/paced.py``)
against a bundled etcd; the check's seconds as group rank 0 recorded them in the job's history
(from the check program's imports done to its findings: the workers wait for the same imports),
the slowest pair's all-reduce, and the wall time from the round's freeze to the first step of the
slowest worker, beside the same job without ``--preflight`` in the same run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rendezvous import EtcdServer  # noqa: E402
from tests.torch.test_stragglers import history, workers  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "torch", "workers", "paced.py")
BIN = os.path.dirname(sys.executable)


def job(endpoint: str, nodes: int, preflight: bool) -> dict:
    """One job of ``nodes`` nodes: the check's record (or None) and the freeze-to-first-step seconds."""
    out = tempfile.mkdtemp(prefix="bench-preflight-")
    rdzv_id = f"preflight-{nodes}-{int(preflight)}-{os.getpid()}"
    args = ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    args += ["--local-addr", "127.0.0.1"] + (["--preflight"] if preflight else []) + [WORKER, out]
    agents = [
        subprocess.Popen([os.path.join(BIN, "elastic-run"), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(nodes)
    ]
    try:
        deadline = time.monotonic() + 300
        while len([w for w in workers(out) if w["steps"]]) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit(f"{nodes} workers did not step within 300 s")
            time.sleep(0.2)
        open(os.path.join(out, "stop"), "w").close()
        for agent in agents:
            agent.wait(timeout=120)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    events = history(endpoint, rdzv_id)
    frozen = min(e["time"] for e in events if e["kind"] == "round_frozen")
    first_steps = [w["steps"][0] for w in workers(out)]
    check = next((e for e in events if e["kind"] == "preflight"), None)
    return {"check": check, "to_step": max(first_steps) - frozen}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,4,8")
    args = parser.parse_args()
    with EtcdServer() as server:
        print("nodes  check (s)  slowest pair (ms)  freeze -> last first step: with / without (s)  findings")
        for nodes in (int(n) for n in args.nodes.split(",")):
            without = job(server.endpoints, nodes, False)
            with_check = job(server.endpoints, nodes, True)
            check = with_check["check"] or {}
            print(
                f"{nodes:5d}  {check.get('seconds', float('nan')):9.2f}  {check.get('slowest_pair_ms') or 0:17.1f}  "
                f"{with_check['to_step']:8.2f} / {without['to_step']:.2f}{'':29s}{check.get('findings') or 'none'}"
            )


if __name__ == "__main__":
    main()
