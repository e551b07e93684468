"""elastic-lighthouse beside torchft's own Lighthouse, in one run: quorum latency and steps per second
for N replica groups, and the time from a replica's death to the next quorum.

    python bench/lighthouse.py [--groups 2,8,32] [--steps 100]

Each server runs in a process of its own (torchft's: its LighthouseServer; ours: one
elastic-lighthouse, then three, on a bundled etcd). N groups are threads of this process, each with
torchft's own LighthouseClient, as a Manager calls it: a quorum per step (step = its step count) and a
heartbeat every 100 ms; a group that ran ahead keeps asking, as a Manager keeps training, until
every group made ``--steps`` steps. ``quorum p50/p99 ms`` is one call's time; ``steps/s`` is a group's steps per
second (all groups' steps / groups / wall time, until every group made ``--steps``).
``death -> quorum s``: three replicas, 8 groups stepping, the
leading replica SIGKILLed: seconds until the first quorum formed after it (torchft's single
Lighthouse has no other replica to go to: its clients never get one).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lighthouse.book import LighthouseKeys  # noqa: E402
from rendezvous.etcd.client import EtcdClient  # noqa: E402
from rendezvous.etcd.server import EtcdServer  # noqa: E402

TORCHFT_SERVER = (
    "import sys, time; from torchft._torchft import LighthouseServer; "
    "s = LighthouseServer(bind='[::]:0', min_replicas=1, join_timeout_ms=100); "
    "print(s.address(), flush=True); time.sleep(3600)"
)


def torchft_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCHFT_SERVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    return proc, proc.stdout.readline().strip()


def ours(endpoints: str, rdzv_id: str, workdir: str) -> tuple[subprocess.Popen, str]:
    address_file = Path(workdir, f"{rdzv_id}-{time.monotonic_ns()}.addr")
    argv = [str(Path(sys.executable).with_name("elastic-lighthouse")), "--bind", "[::]:0", "--min_replicas", "1"]
    argv += [
        "--join_timeout_ms",
        "100",
        "--rdzv-endpoint",
        endpoints,
        "--rdzv-id",
        rdzv_id,
        "--http-bind",
        "127.0.0.1:0",
    ]
    argv += ["--address-file", str(address_file), "--lease-ttl", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (address_file.exists() and address_file.read_text().strip()):
        time.sleep(0.02)
    return proc, address_file.read_text().strip()


class Stepper:
    def __init__(self, rid: str, addresses: list[str], done: threading.Event) -> None:
        from torchft._torchft import LighthouseClient

        self.rid, self.addresses, self.done = rid, addresses, done
        self.index = hash(rid) % len(addresses)
        self.client = LighthouseClient(addr=addresses[self.index], connect_timeout=timedelta(seconds=5))
        self.latencies: list[float] = []
        self.answered: list[float] = []

    def run(self) -> None:
        from torchft._torchft import LighthouseClient

        step = 0
        while not self.done.is_set():
            started = time.perf_counter()
            try:
                quorum = self.client.quorum(replica_id=self.rid, timeout=timedelta(seconds=10), step=step, world_size=1)
            except Exception:  # noqa: BLE001 -- the replica died: the next one
                self.index = (self.index + 1) % len(self.addresses)
                try:
                    self.client = LighthouseClient(
                        addr=self.addresses[self.index], connect_timeout=timedelta(seconds=1)
                    )
                except Exception:  # noqa: BLE001 -- that one too (or the run is over): try again
                    time.sleep(0.05)
                continue
            self.latencies.append(time.perf_counter() - started)
            self.answered.append(quorum.created.seconds + quorum.created.nanos / 1e9)  # when it was formed
            step += 1

    def beat(self) -> None:
        while not self.done.wait(0.1):
            try:
                self.client.heartbeat(self.rid)
            except Exception:  # noqa: BLE001
                pass


def drive(addresses: list[str], groups: int, tag: str) -> tuple[list[Stepper], threading.Event]:
    """Groups that step until told: one that ran ahead still asks, as a Manager keeps training."""
    done = threading.Event()
    steppers = [Stepper(f"{tag}-{i}", addresses, done) for i in range(groups)]
    for s in steppers:
        threading.Thread(target=s.run, daemon=True).start()
        threading.Thread(target=s.beat, daemon=True).start()
    return steppers, done


def measure(addresses: list[str], groups: int, steps: int, tag: str) -> dict:
    started = time.perf_counter()
    steppers, done = drive(addresses, groups, tag)
    while min(len(s.latencies) for s in steppers) < steps:
        time.sleep(0.005)
    wall = time.perf_counter() - started
    done.set()
    latencies = sorted(x for s in steppers for x in s.latencies)
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "steps_per_s": len(latencies) / groups / wall,
    }


def leader_pid(endpoints: str, rdzv_id: str) -> int:
    with EtcdClient(endpoints, timeout=5) as client:
        return int(json.loads(client.get(LighthouseKeys("/elastic", rdzv_id).leader).value)["name"].rsplit("-", 1)[1])


def death_to_quorum(endpoints: str, workdir: str) -> float:
    replicas = [ours(endpoints, "bench-death", workdir) for _ in range(3)]
    steppers, done = drive([a for _, a in replicas], 8, "d")
    time.sleep(2.0)
    pid = leader_pid(endpoints, "bench-death")
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    time.sleep(8.0)
    after = [t for s in steppers for t in s.answered if t > killed]
    done.set()
    for proc, _ in replicas:
        proc.kill()
        proc.wait()
    return min(after) - killed if after else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", default="2,8,32")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-lighthouse-")
    with EtcdServer() as etcd:
        print(
            f"{'groups':>6}  {'server':<22} {'quorum p50 ms':>13} {'p99 ms':>8} {'steps/s':>8}   ratio (ours/torchft)"
        )
        for n in (int(x) for x in args.groups.split(",")):
            tf_proc, tf_addr = torchft_server()
            theirs = measure([tf_addr], n, args.steps, f"t{n}")
            tf_proc.kill()
            one, one_addr = ours(etcd.endpoints, f"bench-{n}", workdir)
            mine = measure([one_addr], n, args.steps, f"o{n}")
            trio = [ours(etcd.endpoints, f"bench3-{n}", workdir) for _ in range(3)]
            three = measure([a for _, a in trio], n, args.steps, f"h{n}")
            for proc, _ in [(one, None), *trio]:
                proc.kill()
            for name, row in (
                ("torchft Lighthouse", theirs),
                ("elastic-lighthouse x1", mine),
                ("elastic-lighthouse x3", three),
            ):
                p50, rate = row["p50_ms"] / theirs["p50_ms"], row["steps_per_s"] / theirs["steps_per_s"]
                ratio = "" if row is theirs else f"p50 {p50:.2f}x, steps/s {rate:.2f}x"
                figures = f"{row['p50_ms']:>13.2f} {row['p99_ms']:>8.2f} {row['steps_per_s']:>8.1f}"
                print(f"{n:>6}  {name:<22} {figures}   {ratio}")
        death = death_to_quorum(etcd.endpoints, workdir)
        print(
            f"death -> quorum: elastic-lighthouse x3, leader SIGKILLed: {death:.2f} s "
            "(lease TTL 2 s); torchft's Lighthouse: never (no other replica)"
        )


if __name__ == "__main__":
    main()
