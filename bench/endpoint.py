"""What the metrics and probes endpoint costs an agent, measured side by side in one run.

    python bench/endpoint.py [--repeat 5]

1. `elastic-run --standalone --nproc-per-node 1` on a trivial script, wall time: endpoint off (no
   --http-port), and on (--http-port 0);
2. the agent's RSS while its worker runs, off and on (after a scrape of /metrics, so that
   prometheus-client and the server are loaded and have answered);
3. the time one /metrics scrape takes.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

BIN = os.path.join(os.path.dirname(sys.executable), "elastic-run")


def wall(extra: list[str], script: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [BIN, "--standalone", "--nproc-per-node", "1", *extra, script],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    return time.perf_counter() - started


def rss(extra: list[str], script: str) -> tuple[float, float | None]:
    """(agent RSS in MB while the worker sleeps, seconds one /metrics scrape took or None)."""
    agent = subprocess.Popen(
        [BIN, "--standalone", "--nproc-per-node", "1", "--http-host", "127.0.0.1", *extra, script, "6"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    scrape = None
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = agent.stderr.readline()
            lines.append(line)
            if "round 1:" in line:
                break
        endpoint = next((m.group(1) for m in (re.search(r"http://(\S+) \(", line) for line in lines) if m), None)
        time.sleep(2)
        if endpoint:
            started = time.perf_counter()
            urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5).read()
            scrape = time.perf_counter() - started
        return psutil.Process(agent.pid).memory_info().rss / 2**20, scrape
    finally:
        agent.kill()
        agent.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "w.py")
        with open(script, "w") as handle:
            handle.write("import sys, time\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")
        off, on = [], []
        for _ in range(opts.repeat):  # interleaved, so that the machine's drift hits both alike
            off.append(wall([], script))
            on.append(wall(["--http-port", "0"], script))
        rss_off, _ = rss([], script)
        rss_on, scrape = rss(["--http-port", "0"], script)
    print(f"{'measure':<52}{'endpoint off':>14}{'on':>14}")
    print(
        f"{'--standalone, trivial script: wall time (median of ' + str(opts.repeat) + ')':<52}"
        f"{statistics.median(off):>12.3f} s{statistics.median(on):>12.3f} s  "
        f"({statistics.median(on) / statistics.median(off):.2f}x)"
    )
    print(f"{'agent RSS while its worker runs':<52}{rss_off:>11.1f} MB{rss_on:>11.1f} MB  (+{rss_on - rss_off:.1f} MB)")
    print(f"{'one /metrics scrape':<52}{'-':>14}{scrape * 1000:>11.1f} ms")


if __name__ == "__main__":
    main()
