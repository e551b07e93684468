"""Straggler scores on a real job: false verdicts while every node is healthy, etcd writes at a
steady pace, and how long a slowed rank takes to be named.

    python bench/stragglers.py [--nodes 4] [--healthy 600] [--slow 60] [--ddp]

Runs ``--nodes`` agents (``elastic-run``, one gloo worker each, ``tests/torch/workers/paced.py``:
20 ms of CPU work a step in ``elastic.section()``, or under ``elastic.watch_ddp`` with ``--ddp``)
against a bundled etcd on this machine. For ``--healthy`` seconds nothing is done: every
``straggler`` record in the job's history then is a false verdict. Then one worker is SIGSTOPped
60 ms of every 100 ms for up to ``--slow`` seconds: the seconds until its node names it. Prints the
false verdicts, the pace keys' writes (all, and after the first minute: a steady job writes none
but when a node's pace moves by 10 %), and the detection delay.
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

from rendezvous import EtcdClient, EtcdServer  # noqa: E402
from rendezvous.job.keys import JobKeys  # noqa: E402
from tests.torch.test_stragglers import Slowdown, history, workers  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "torch", "workers", "paced.py")
BIN = os.path.dirname(sys.executable)


def pace_writes(client: EtcdClient, keys: JobKeys) -> int:
    """Writes of the nodes' pace keys so far (each key's version: one key per node, kept across rounds)."""
    kvs, _ = client.get_prefix(keys.pace())
    return sum(kv.version for kv in kvs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--healthy", type=float, default=600.0)
    parser.add_argument("--slow", type=float, default=60.0)
    parser.add_argument("--ddp", action="store_true")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="bench-stragglers-")
    rdzv_id = f"stragglers-{os.getpid()}"
    with EtcdServer() as server:
        endpoint = server.endpoints
        client = EtcdClient(endpoint)
        keys = JobKeys("/elastic", rdzv_id)
        common = ["--nnodes", str(args.nodes), "--nproc-per-node", "1", "--rdzv-endpoint", endpoint]
        common += ["--rdzv-id", rdzv_id, "--local-addr", "127.0.0.1", WORKER, out] + (["--ddp"] if args.ddp else [])
        logs = [open(os.path.join(out, f"agent-{i}.log"), "w") for i in range(args.nodes)]
        agents = [
            subprocess.Popen([os.path.join(BIN, "elastic-run"), *common], stdout=log, stderr=subprocess.STDOUT)
            for log in logs
        ]
        try:
            deadline = time.monotonic() + 120
            while len([w for w in workers(out) if len(w["steps"]) > 5]) < args.nodes:
                if time.monotonic() > deadline:
                    raise SystemExit("the workers did not start within 120 s")
                time.sleep(0.5)
            started = time.monotonic()
            time.sleep(60.0)
            after_first_minute = pace_writes(client, keys)
            time.sleep(max(0.0, args.healthy - 60.0))
            healthy_for = time.monotonic() - started
            false = [e for e in history(endpoint, rdzv_id) if e["kind"] == "straggler"]
            writes = pace_writes(client, keys)
            steps = sum(len(w["steps"]) for w in workers(out)) / args.nodes
            slow = next(w for w in workers(out) if w["rank"] == args.nodes - 1)
            slowdown, slowed_at, named = Slowdown(slow["pid"]), time.monotonic(), None
            try:
                while named is None and time.monotonic() - slowed_at < args.slow:
                    found = [e for e in history(endpoint, rdzv_id) if e["kind"] == "straggler"]
                    named = time.monotonic() - slowed_at if len(found) > len(false) else None
                    time.sleep(0.5)
            finally:
                slowdown.stop()
            open(os.path.join(out, "stop"), "w").close()
            codes = [agent.wait(timeout=60) for agent in agents]
        finally:
            for agent in agents:
                if agent.poll() is None:
                    agent.kill()
        print(f"{args.nodes} healthy nodes for {healthy_for:.0f} s ({steps / healthy_for:.1f} steps/s a rank):")
        print(f"  false straggler verdicts: {len(false)} {false if false else ''}")
        print(f"  pace writes: {writes} in all, {writes - after_first_minute} after the first minute")
        shown = f"{named:.1f} s" if named is not None else f"not within {args.slow:.0f} s"
        print(f"rank {args.nodes - 1} slowed (SIGSTOP 60 ms of every 100 ms): named a straggler after {shown}")
        print(f"agents' exit codes: {codes} (logs in {out})")


if __name__ == "__main__":
    main()
