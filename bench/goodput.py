"""Goodput under a fault a minute: elastic-run and torchrun on the same script and the same faults.

    python bench/goodput.py [--minutes 10] [--every 60] [--seed 1] [--step-time 0.05] [--launchers elastic,torchrun]

The job: examples/ddp_inprocess.py (DDP on gloo, one worker a node, under ``elastic.inprocess``: a
fault's survivors keep their process and state), 3 nodes and 1 hot spare (4 agents, --nnodes 3),
elastic-run against 3 etcd members with --replace-stragglers; torchrun on its c10d backend with the
3 nodes only (with a fourth agent waiting, torchrun 2.13's agents restart their workers every second
or two once a fault has made them re-rendezvous: a node always waits, and no step is done). Every
--every seconds a fault, each kind as often as the others in a seeded order (the same for both
launchers):

- worker: a worker SIGKILLed;
- machine: an agent and everything it started SIGKILLed at once; a new machine (agent) joins at once
  (under torchrun never the first agent's: it hosts the c10d store, and the job would end with it);
- hang: a worker SIGSTOPped (torchrun cannot see it: it is let go with SIGCONT at the next fault);
- slow: a worker at half speed until the next fault (each step twice as long: the script's --slow-dir);
- etcd: an etcd member SIGKILLed, back after 20 s (torchrun has no etcd: nothing happens to it).

At the end the job is closed (``elastic-ctl close``; torchrun's agents get SIGTERM). Printed: each
fault as injected; each launcher's goodput by the workers' own step times (the steps that count,
at the job's healthy step time -- the mean of the steps no longer than 1.5 times their median: jitter
is in it, a fault's stalls are not -- over the wall time from the first agent's start to the job's end);
for elastic-run, the project's own account (``elastic-ctl report``) beside it, its lost time by
cause, and where the two differ.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from launcher.hangs.steptimes import STALL  # noqa: E402
from rendezvous.etcd.server import EtcdCluster, free_port  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from recovery import children, events  # noqa: E402 -- bench/recovery.py's timeline reader and process tree

SCRIPT = os.path.join(HERE, "examples", "ddp_inprocess.py")
BIN = os.path.dirname(sys.executable)
FAULTS = ("worker", "machine", "hang", "slow", "etcd")
NODES, SPARES = 3, 1


class Job:
    """One launcher's agents on one job, and the faults done to them."""

    def __init__(self, launcher: str, work: str, endpoints: str, step_time: float) -> None:
        self.launcher, self.work, self.endpoints = launcher, work, endpoints
        self.run_id = f"goodput-{uuid.uuid4().hex[:8]}"
        self.step_time = step_time
        self.agents: list[subprocess.Popen] = []
        self.stopped: list[int] = []  # SIGSTOPped workers (torchrun: let go at the next fault)
        self.started = time.time()
        self.ended: float | None = None
        self.restarts: list[tuple[float, int]] = []  # (when, etcd member) to start again, from the main loop

    def argv(self) -> list[str]:
        args = ["--nnodes", str(NODES), "--nproc-per-node", "1", "--max-restarts", "1000"]
        args += ["--rdzv-endpoint", self.endpoints, "--rdzv-id", self.run_id, "--local-addr", "127.0.0.1"]
        script = [SCRIPT, "--steps", "100000000", "--step-time", str(self.step_time), "--timeline", self.work]
        script += ["--slow-dir", self.work]
        if self.launcher == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", *args, *script]
        extra = ["--rdzv-conf", "last_call_timeout=1", "--replace-stragglers"]
        return [os.path.join(BIN, "elastic-run"), *args, *extra, *script]

    def add_agent(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        log = open(os.path.join(self.work, f"agent-{len(self.agents)}.log"), "w")
        self.agents.append(subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()

    def steps(self) -> list[dict]:
        return [e for e in events(self.work) if e.get("event") == "step"]

    def workers(self) -> list[tuple[int, int]]:
        """(agent index, worker pid) of each live worker (a process with a timeline, in an agent's tree)."""
        pids = {r["pid"] for r in self.steps()[-200:]}
        out = []
        for i, agent in enumerate(self.agents):
            for pid in children(agent.pid):
                if pid in pids:
                    out.append((i, pid))
        return out

    def let_go(self) -> None:
        """The previous fault ends: a hung worker is let go (torchrun), a slowed node speeds up."""
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        for flag in glob.glob(os.path.join(self.work, "slow-*")):
            os.remove(flag)

    def slow(self, pid: int) -> None:
        """The worker takes twice as long a step (the script's --slow-dir), as on a throttled GPU."""
        open(os.path.join(self.work, f"slow-{pid}"), "w").close()


def schedule(count: int, pick: random.Random) -> list[str]:
    """``count`` faults, each kind as often as the others (but for the remainder), in a seeded order."""
    kinds = [FAULTS[i % len(FAULTS)] for i in range(count)]
    pick.shuffle(kinds)
    return kinds


def inject(job: Job, fault: str, pick: random.Random, etcd: EtcdCluster | None) -> str:
    job.let_go()
    running = job.workers()
    if fault == "machine" and job.launcher == "torchrun":  # the first agent hosts the c10d store: the job
        running = [(agent, pid) for agent, pid in running if agent != 0]  # would end with it (no recovery)
    if not running:
        return "no worker running: nothing injected"
    agent, pid = pick.choice(running)
    if fault == "worker":
        _signal(pid, signal.SIGKILL)
        return f"worker {pid} SIGKILLed"
    if fault == "hang":
        _signal(pid, signal.SIGSTOP)
        if job.launcher == "torchrun":
            job.stopped.append(pid)
        return f"worker {pid} SIGSTOPped"
    if fault == "slow":
        job.slow(pid)
        return f"worker {pid} at half speed"
    if fault == "machine":
        for victim in [job.agents[agent].pid, *children(job.agents[agent].pid)]:
            _signal(victim, signal.SIGKILL)
        job.add_agent()
        return f"agent {agent} and its processes SIGKILLed; a new agent joined"
    if etcd is None:
        return "an etcd member: torchrun has none"
    member = pick.randrange(len(etcd.members))
    etcd.stop_member(member)
    job.restarts.append((time.time() + 20.0, member))
    return f"etcd member {member} SIGKILLed (back in 20 s)"


def run(launcher: str, args: argparse.Namespace, etcd: EtcdCluster | None) -> tuple[Job, dict | None]:
    work = tempfile.mkdtemp(prefix=f"bench-goodput-{launcher}-")
    endpoints = etcd.endpoints if etcd is not None else f"127.0.0.1:{free_port()}"
    job = Job(launcher, work, endpoints, args.step_time)
    for _ in range(NODES + (SPARES if launcher == "elastic" else 0)):  # torchrun churns with a spare: none
        job.add_agent()
    pick = random.Random(args.seed)
    faults = schedule(int(args.minutes * 60 // args.every), pick)
    deadline = job.started + args.minutes * 60
    next_fault = job.started + args.every
    try:
        while time.time() < deadline:
            if time.time() >= next_fault and faults:
                fault = faults.pop(0)
                print(f"  {launcher} {time.time() - job.started:6.1f} s: {fault}: {inject(job, fault, pick, etcd)}")
                next_fault += args.every
            restart_members(job, etcd)
            time.sleep(0.2)
        job.let_go()
        job.ended = time.time()
        return job, close(job)
    finally:
        for agent in job.agents:
            for pid in [agent.pid, *children(agent.pid)]:
                _signal(pid, signal.SIGKILL)


def restart_members(job: Job, etcd: EtcdCluster | None) -> None:
    """The etcd members whose 20 s are up, started again -- from the main thread: a member dies with
    the thread that started it (``rendezvous.processes.start_process``), and a timer's thread ends
    at once (members started from one died in some runs: the job lost its quorum at the next etcd
    fault)."""
    for due, member in list(job.restarts):
        if etcd is not None and time.time() >= due:
            etcd.start_member(member, wait=False)
            job.restarts.remove((due, member))


def close(job: Job) -> dict | None:
    """End the job; elastic-run's own account of it."""
    if job.launcher == "torchrun":
        for agent in job.agents:
            _signal(agent.pid, signal.SIGTERM)
        return None
    ctl = os.path.join(BIN, "elastic-ctl")
    common = ["--rdzv-endpoint", job.endpoints, "--rdzv-id", job.run_id]
    subprocess.run([ctl, "close", *common, "--reason", "the benchmark ended"], capture_output=True, timeout=60)
    for agent in job.agents:
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    page = os.path.join(job.work, "goodput.html")
    report = subprocess.run([ctl, "report", *common[2:], *common[:2], "--html", page], capture_output=True, text=True)
    print("\n".join("    " + line for line in report.stdout.splitlines()))
    done = subprocess.run([ctl, "report", *common, "--json", "--no-html"], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else None


def _healthy(intervals: list[float]) -> float:
    """The mean of the steps no longer than STALL times their median (as the account's healthy step)."""
    median = statistics.median(intervals)
    return statistics.mean(t for t in intervals if t <= STALL * median)


def external(job: Job) -> tuple[float, float, float, int]:
    """(goodput, training seconds, wall seconds, steps) by the workers' own step times."""
    steps = job.steps()
    intervals = []
    by_pid: dict[int, list[float]] = {}
    for r in steps:
        by_pid.setdefault(r["pid"], []).append(r["t"])
    for times in by_pid.values():
        intervals += [b - a for a, b in zip(times, times[1:])]
    healthy = _healthy(intervals) if intervals else 0.0
    done = max((r["step"] for r in steps), default=0)
    wall = (job.ended or time.time()) - job.started
    return done * healthy / wall, done * healthy, wall, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-time", type=float, default=0.05, help="each step's sleep (a heavier model's step)")
    parser.add_argument("--launchers", default="elastic,torchrun")
    args = parser.parse_args()
    print(f"{NODES} nodes + {SPARES} spare x 1 worker, gloo, {SCRIPT}")
    print(f"{args.minutes:g} min a launcher, a fault every {args.every:g} s (seed {args.seed})")
    results = {}
    for launcher in args.launchers.split(","):
        if launcher == "elastic":
            with EtcdCluster(3) as etcd:
                results[launcher] = run(launcher, args, etcd)
        else:
            results[launcher] = run(launcher, args, None)
    print(f"\n{'':<12} {'goodput':>8} {'training':>9} {'wall':>7} {'steps':>7}")
    for launcher, (job, _) in results.items():
        good, trained, wall, done = external(job)
        print(f"{launcher:<12} {good * 100:7.2f}% {trained:8.1f}s {wall:6.1f}s {done:7d}   (the workers' step times)")
    if "elastic" in results and results["elastic"][1] is not None:
        account, (good, *_) = results["elastic"][1], external(results["elastic"][0])
        print(f"{'elastic':<12} {account['goodput'] * 100:7.2f}% {account['productive']:8.1f}s {account['wall']:6.1f}s"
              f"           (its own account: elastic-ctl report)")  # fmt: skip
        print(f"  the two differ by {abs(account['goodput'] - good) * 100:.2f} percentage points")
        for cause, seconds in sorted(account["lost"].items(), key=lambda item: -item[1]):
            print(f"  lost to {account['titles'][cause]:<36} {seconds:7.2f} s")


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
