"""Time lost per fault on a DDP training script, elastic-run and torchrun side by side in one run.

    python bench/recovery.py [--nodes 3] [--faults worker,agent,node,hang] [--wait 45] [--in-memory] [--inprocess]

Both launchers run the same script (examples/ddp_steps.py: gloo, one worker per node, a save every
50 steps; with --in-memory, under elastic-run, elastic.checkpoint after every step) with the same
arguments (--nnodes 2:N --nproc-per-node 1 --max-restarts 3; torchrun on
its c10d backend, elastic-run on a local etcd). Once the job has run 150 steps a fault is injected
into the node of group rank 1 (never the node hosting torchrun's c10d store):

- worker: its worker SIGKILLed;
- agent: its agent SIGKILLed (elastic-run's reaper outlives it; torchrun's worker does too);
- node: its agent, reaper and worker SIGKILLed at once, as a machine dies;
- hang: its worker SIGSTOPped (elastic-run judges the hang from the learned step time).

With --inprocess a third row runs elastic-run on examples/ddp_inprocess.py (the same model and
steps, under ``elastic.inprocess``: the survivors keep their process, the model outside ``train``).

Time lost is from the fault to the first step completed after it by a process started after it,
or by one whose ``train`` was called again after it (in-process).
The breakdown gives when, after the fault, each stage was reached: the launcher's first line about
it (seen), the next round's (round), the new rank 0 process started, torch imported, the process
group joined, the model and optimizer built, the save restored, the first step done. "Redone" is the
steps done before the fault that the restored save did not hold. A launcher that does not resume
within --wait seconds says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from rendezvous import EtcdServer  # noqa: E402
from rendezvous.etcd.server import free_port  # noqa: E402

SCRIPT = os.path.join(HERE, "examples", "ddp_steps.py")
INPROCESS = os.path.join(HERE, "examples", "ddp_inprocess.py")
BIN = os.path.dirname(sys.executable)
WARM_STEPS = 150
STAGES = ("started", "imported", "joined", "built", "restored", "step")
SEEN = re.compile(r"fail|lost|left|hung|hang|exited|FAILED|[Rr]estart")
ROUND = re.compile(r"round \d+: group rank|Rendezvous complete")


@dataclass
class Node:
    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)

    def read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))


@dataclass
class Result:
    lost: float | None = None  # seconds from the fault to the first step after it
    redone: int | None = None
    stages: dict[str, float] = field(default_factory=dict)  # stage -> seconds after the fault
    last: str = ""  # when it did not resume: the last line its agents printed


def command(launcher: str, endpoint: str, run_id: str, nodes: int, work: str, extra: tuple = ()) -> list[str]:
    args = ["--nnodes", f"2:{nodes}", "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-endpoint", endpoint]
    args += ["--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=1", "--local-addr", "127.0.0.1"]
    script = [SCRIPT, "--steps", "100000", "--checkpoint", os.path.join(work, "save.pt"), "--timeline", work, *extra]
    if extra == ("--inprocess",):  # the model kept outside train, nothing saved
        script = [INPROCESS, "--steps", "100000", "--timeline", work]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", *args, *script]
    return [os.path.join(BIN, "elastic-run"), *args, *script]


def events(work: str) -> list[dict]:
    found = []
    for path in glob.glob(os.path.join(work, "*.jsonl")):
        with open(path) as lines:
            for line in lines:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short by a kill
    return sorted(found, key=lambda e: e["t"])


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def worker_of(work: str, rank: int) -> int | None:
    """The pid of the newest process of ``rank``."""
    pids = [e["pid"] for e in events(work) if e["rank"] == rank and e["event"] == "started"]
    return pids[-1] if pids else None


def node_of(nodes: list[Node], pid: int) -> Node:
    return next(n for n in nodes if pid in children(n.process.pid))


def inject(fault: str, nodes: list[Node], work: str) -> float:
    """The fault, on the node of rank 1's worker; when it was injected."""
    victim = worker_of(work, 1)
    node = node_of(nodes, victim)
    tree = [node.process.pid, *children(node.process.pid)]
    when = time.time()
    if fault == "worker":
        os.kill(victim, signal.SIGKILL)
    elif fault == "hang":
        os.kill(victim, signal.SIGSTOP)
    elif fault == "agent":
        os.kill(node.process.pid, signal.SIGKILL)
    else:  # node: everything of it at once
        _kill(tree)
    return when


def measure(work: str, nodes: list[Node], when: float, wait: float) -> Result:
    def resumed() -> dict | None:
        timeline = events(work)
        old = {e["pid"] for e in timeline if e["t"] < when}
        again = {}  # pid -> when its train was called again after the fault (in-process)
        for e in timeline:
            if e["event"] == "joined" and e["t"] > when and e["pid"] in old:
                again.setdefault(e["pid"], e["t"])
        return next(
            (
                e
                for e in timeline
                if e["event"] == "step"
                and e["t"] > when
                and (e["pid"] not in old or e["t"] > again.get(e["pid"], 1e18))
            ),
            None,
        )

    if not wait_until(lambda: resumed() is not None, wait):
        lines = sorted((t, text) for n in nodes for t, text in n.lines if text.strip())
        return Result(last=lines[-1][1][-110:] if lines else "(no output)")
    first, timeline = resumed(), events(work)
    done_before = max((e["step"] for e in timeline if e["event"] == "step" and e["t"] < when), default=0)
    started = [e["pid"] for e in timeline if e["event"] == "started" and e["rank"] == 0 and e["t"] > when]
    stages: dict[str, float | None] = {}
    for e in timeline:  # the first new rank 0 process, stage by stage
        if started and e["pid"] == started[0]:
            stages.setdefault(e["event"], e["t"] - when)
    restored = next((e["step"] for e in timeline if e["event"] == "restored" and e["t"] > when), done_before)
    lines = sorted((t, text) for n in nodes for t, text in n.lines if t > when)
    seen = next((t - when for t, text in lines if SEEN.search(text)), None)
    formed = next((t - when for t, text in lines if ROUND.search(text)), None)
    redone = max(0, done_before - restored)  # a rank may finish (and keep) one more step after the fault
    return Result(first["t"] - when, redone, {"seen": seen, "round": formed, **stages})


def trial(launcher: str, fault: str, endpoint: str, nodes: int, wait: float, extra: tuple = ()) -> Result:
    work = tempfile.mkdtemp(prefix="bench-recovery-")
    argv = command(launcher, endpoint, f"recovery-{uuid.uuid4().hex[:8]}", nodes, work, extra)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    agents = []
    for _ in range(nodes):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        agents.append(Node(process))
        threading.Thread(target=agents[-1].read, daemon=True).start()
    try:
        warm = lambda: any(e["event"] == "step" and e["step"] >= WARM_STEPS for e in events(work))  # noqa: E731
        if not wait_until(warm, 120):
            raise RuntimeError(f"{launcher}: the job did not reach step {WARM_STEPS}")
        when = inject(fault, agents, work)
        return measure(work, agents, when, wait)
    finally:
        workers = {e["pid"] for e in events(work)}  # an orphan of a killed agent is in no tree
        for node in agents:
            _kill([node.process.pid, *children(node.process.pid), *workers])
            node.process.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def row(name: str, result: Result) -> str:
    if result.lost is None:
        return f"{name:<24} {'did not resume':>10}; its last line: {result.last}"
    cells = [f"{result.lost:10.2f}", f"{result.redone:7d}"]
    cells += [f"{result.stages[s]:8.2f}" if result.stages.get(s) is not None else f"{'-':>8}" for s in _COLUMNS]
    return f"{name:<24} " + " ".join(cells)


_COLUMNS = ("seen", "round", *STAGES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--faults", default="worker,agent,node,hang")
    parser.add_argument("--wait", type=float, default=45.0, help="seconds to wait for a launcher to resume")
    parser.add_argument("--in-memory", action="store_true", help="the script keeps its state with elastic.checkpoint")
    parser.add_argument("--inprocess", action="store_true", help="a third row: elastic-run, elastic.inprocess")
    args = parser.parse_args()
    print(f"{args.nodes} nodes x 1 worker, gloo, {SCRIPT}; seconds after the fault", flush=True)
    print(f"{'':<24} {'lost':>10} {'redone':>7} " + " ".join(f"{c:>8}" for c in _COLUMNS), flush=True)
    with EtcdServer() as etcd:
        for fault in args.faults.split(","):
            extra = ("--in-memory",) if args.in_memory else ()
            ours = trial("elastic-run", fault, etcd.endpoints, args.nodes, args.wait, extra)
            print(row(f"{fault}: elastic-run", ours), flush=True)
            theirs = trial("torchrun", fault, f"127.0.0.1:{free_port()}", args.nodes, args.wait, extra)
            print(row(f"{fault}: torchrun (c10d)", theirs), flush=True)
            if args.inprocess:
                kept = trial("elastic-run", fault, etcd.endpoints, args.nodes, args.wait, ("--inprocess",))
                print(row(f"{fault}: in-process", kept), flush=True)
            if ours.lost and theirs.lost:
                print(f"{'':<24} torchrun / elastic-run: {theirs.lost / ours.lost:.1f}x", flush=True)


if __name__ == "__main__":
    main()
