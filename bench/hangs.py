"""Hang detection, measured: what a heartbeat costs, and how soon a hung rank is restarted.

    python bench/hangs.py [--calls 2000000] [--timeouts 3,6] [--repeat 2]

1. elastic.heartbeat() per call (ns), under elastic-run's record and with no record (not launched),
   from one thread and from four at once; beside it, a bare time.monotonic() call;
2. two agents x 1 worker on a local etcd, gloo all_reduce each step, rank 1 stops in step 5:
   seconds from rank 1's last heartbeat to the restart line on each node, beside the configured
   --heartbeat-timeout (the difference is what detection adds).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.hangs import beatfile as beats  # noqa: E402
from rendezvous import EtcdServer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = os.path.join(ROOT, "tests", "hangs", "workers", "steps.py")
COST = """
import sys, threading, timeit, time, elastic
calls, threads = int(sys.argv[1]), int(sys.argv[2])
elastic.heartbeat()
def run(out):
    out.append(timeit.timeit(elastic.heartbeat, number=calls) / calls * 1e9)
results = []
workers = [threading.Thread(target=run, args=(results,)) for _ in range(threads)]
start = time.perf_counter()
[w.start() for w in workers]; [w.join() for w in workers]
print(max(results), (time.perf_counter() - start) / (calls * threads) * 1e9)
"""


def heartbeat_cost(calls: int, threads: int, attached: bool) -> tuple[float, float]:
    """(ns per call in the slowest thread, wall ns per call over all threads)."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {k: v for k, v in os.environ.items() if k != "ELASTIC_HEARTBEAT_FILE"}
        if attached:
            env["ELASTIC_HEARTBEAT_FILE"] = os.path.join(scratch, "0.beat")
            beats.create(env["ELASTIC_HEARTBEAT_FILE"])
        out = subprocess.run(
            [sys.executable, "-c", COST, str(calls), str(threads)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout.split()
        return float(out[0]), float(out[1])


def detection(endpoint: str, timeout: float) -> list[float]:
    """Seconds from rank 1's last heartbeat to the restart line, on each of two nodes."""
    out, rdzv_id = tempfile.mkdtemp(prefix="bench-hangs-"), f"bench-{uuid.uuid4().hex[:8]}"
    args = [
        os.path.join(os.path.dirname(sys.executable), "elastic-run"),
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--local-addr",
        "127.0.0.1",
        "--rdzv-conf",
        "last_call_timeout=1",
        "--max-restarts",
        "1",
        "--heartbeat-timeout",
        str(timeout),
        STEPS,
        "--out",
        out,
        "--gloo",
        "--hang",
        "1:5",
        "--steps",
        "8",
    ]
    seen: list[list[float]] = [[], []]

    def follow(process: subprocess.Popen, into: list[float]) -> None:
        for line in process.stdout:
            if re.search(r"rank 1 on node \S+ hung: .*restarting", line):
                into.append(time.time())

    agents = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT) for _ in range(2)
    ]
    readers = [threading.Thread(target=follow, args=(a, s), daemon=True) for a, s in zip(agents, seen)]
    [r.start() for r in readers]
    for agent in agents:
        agent.wait(timeout=300)
    [r.join(timeout=10) for r in readers]
    with open(os.path.join(out, "1.0.beat")) as handle:
        last = float(handle.read())
    return [s[0] - last for s in seen if s]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--timeouts", default="3,6")
    parser.add_argument("--repeat", type=int, default=2)
    opts = parser.parse_args()
    clock = timeit.timeit(time.monotonic, number=opts.calls) / opts.calls * 1e9
    print(f"time.monotonic() alone: {clock:.0f} ns per call")
    print(f"{'elastic.heartbeat()':<34}{'1 thread':>12}{'4 threads (slowest / wall)':>30}")
    for attached in (True, False):
        one = heartbeat_cost(opts.calls, 1, attached)
        four = heartbeat_cost(opts.calls // 4, 4, attached)
        label = "under elastic-run (a record)" if attached else "not launched (no record)"
        print(f"  {label:<32}{one[0]:>9.0f} ns{four[0]:>17.0f} / {four[1]:.0f} ns")
    server = EtcdServer().start()
    try:
        endpoint = server.endpoints
        print("\ndetection: rank 1 stops in step 5 (2 agents x 1 worker, gloo all_reduce each step)")
        print(f"{'--heartbeat-timeout':>20}  {'last heartbeat -> restart line, each node (s)':<48}{'added (s)':>10}")
        for timeout in (float(t) for t in opts.timeouts.split(",")):
            runs = [detection(endpoint, timeout) for _ in range(opts.repeat)]
            flat = [x for run in runs for x in run]
            shown = "  ".join("/".join(f"{x:.2f}" for x in run) for run in runs)
            print(f"{timeout:>20g}  {shown:<48}{statistics.median(flat) - timeout:>10.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
