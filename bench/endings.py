"""Every run ends: repeated trials of each recovery fault under each start mode, on a DDP script shaped
like the common tutorials, checking that the job ends on every surviving agent with the expected
exit code and leaves no process behind.

    python bench/endings.py [--trials 10] [--faults worker,agent,node,hang] [--modes plain,warm,inprocess]
                            [--busy 1] [--exit-stuck-timeout 10]

A trial runs 3 agents (``--nnodes 2:3 --nproc-per-node 1 --max-restarts 3``, one local etcd) on
examples/ddp_epochs.py (a DataLoader with pin_memory=True, a snapshot by rank 0 every epoch, the
trainer and its DDP model kept to the end of main(), destroy_process_group before main() returns, as
in PyTorch's tutorial; elastic.heartbeat() each step) -- or, in mode ``inprocess``, on
examples/ddp_inprocess.py under ``elastic.inprocess``. Once the job has taken some steps, the fault
hits the node of rank 1:

- worker: its worker SIGKILLed;            every agent must exit 0
- agent: its agent SIGKILLed;              the two others must exit 0
- node: agent, reaper and workers SIGKILLed at once (a machine's death); the two others exit 0
- hang: its worker SIGSTOPped (found by the hang watch, then restarted); every agent exits 0

Modes: ``plain`` (--no-warm-start), ``warm`` (workers forked from the warm interpreter, the
default), ``inprocess``. A trial fails when an agent is still running --end seconds after the
fault, exits with another code, or when any process the trial started (agents, reapers, warm
interpreters, workers forked or not) is alive after the agents are gone. Per cell it prints the
trials that ended as expected, the leftovers, and the exit lag: seconds from the last worker
process's exit to the last agent's exit (median and max; what the exit barrier and the agents'
close-down cost), and the trials in which an agent found a worker stuck at exit (PyTorch's teardown
deadlock: ended after ``--exit-stuck-timeout`` seconds of doing nothing; their lag is that long).
``--busy N`` runs N CPU-bound processes beside the job all along (a busy machine: the deadlock is
met more often there).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import psutil

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from recovery import events  # noqa: E402 -- the timeline reader of bench/recovery.py, one for both

from launcher.hangs.procstat import run_delay  # noqa: E402 -- its main thread's wait for a CPU
from rendezvous import EtcdServer  # noqa: E402

BIN = os.path.dirname(sys.executable)
EPOCHS = os.path.join(HERE, "examples", "ddp_epochs.py")
INPROCESS = os.path.join(HERE, "examples", "ddp_inprocess.py")
KILLS_THE_AGENT = ("agent", "node")  # the faults after which the victim's agent has no exit code to check


@dataclass
class Trial:
    codes: list[int | str] = field(default_factory=list)  # per agent; "running" if it did not end
    leftovers: list[str] = field(default_factory=list)
    lag: float | None = None  # last worker process gone -> last agent exit
    starved: float = 0.0  # of the lag: seconds the last agent's main thread waited for a CPU (a busy machine's share)
    victim: int = -1  # the index of the agent of the node the fault hit
    stuck: int = 0  # workers an agent found stuck at exit (and ended)

    def ok(self, fault: str) -> bool:
        checked = [c for i, c in enumerate(self.codes) if fault not in KILLS_THE_AGENT or i != self.victim]
        return bool(checked) and all(code == 0 for code in checked) and not self.leftovers


STUCK_LINE = "is stuck at exit"


def command(mode: str, endpoint: str, run_id: str, work: str, stuck_after: float = 10.0) -> list[str]:
    args = ["--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-endpoint", endpoint]
    args += ["--exit-stuck-timeout", f"{stuck_after:g}"]
    args += ["--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=1", "--local-addr", "127.0.0.1"]
    if mode == "plain":
        args.append("--no-warm-start")
    if mode == "inprocess":
        script = [INPROCESS, "--steps", "300", "--step-time", "0.02", "--timeline", work]
    else:
        script = [EPOCHS, "--epochs", "5", "--epoch-seconds", "0.8", "--heartbeat", "--timeline", work]
        script += ["--snapshot", os.path.join(work, "snapshot.pt")]
    return [os.path.join(BIN, "elastic-run"), *args, *script]


def _tree(pid: int) -> set[int]:
    try:
        return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _victim(work: str, agents: list[subprocess.Popen]) -> tuple[int, int]:
    """Rank 1's newest worker process and the index of its agent."""
    pid = [e["pid"] for e in events(work) if e["rank"] == 1 and e["event"] == "started"][-1]
    return pid, next(i for i, a in enumerate(agents) if pid in _tree(a.pid))


def inject(fault: str, work: str, agents: list[subprocess.Popen]) -> int:
    """The fault, on the node of rank 1; the index of that node's agent."""
    worker, index = _victim(work, agents)
    agent = agents[index]
    if fault == "worker":
        os.kill(worker, signal.SIGKILL)
    elif fault == "hang":
        os.kill(worker, signal.SIGSTOP)
    elif fault == "agent":
        os.kill(agent.pid, signal.SIGKILL)
    else:
        for pid in _tree(agent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return index


def busy(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes (a machine busy with something else); the caller kills them."""
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


def trial(fault: str, mode: str, endpoint: str, end: float, stuck_after: float = 10.0) -> Trial:
    work = tempfile.mkdtemp(prefix="bench-endings-")
    argv = command(mode, endpoint, f"endings-{uuid.uuid4().hex[:8]}", work, stuck_after)
    logs = [open(os.path.join(work, f"agent{i}.log"), "w") for i in range(3)]
    agents = [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=work) for log in logs]
    seen: set[int] = set()  # every process of the trial, looked for as it runs (orphans are in no tree later)
    result = Trial()
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "step" and e["rank"] == 1 for e in events(work)) or len(events(work)) < 60:
            seen.update(*(_tree(a.pid) for a in agents))
            if time.monotonic() > deadline or any(a.poll() is not None for a in agents):
                result.codes = ["no start"] * 3
                return result
            time.sleep(0.05)
        seen.update(*(_tree(a.pid) for a in agents))
        result.victim = inject(fault, work, agents)
        exits: dict[int, float] = {}
        gone: dict[int, float] = {}  # worker pid -> when it was seen gone
        waited: dict[int, float] = {}  # agent index -> its main thread's run-queue wait, the newest read
        waited_at_gone: dict[int, float] = {}  # the same when the last worker was seen gone
        deadline = time.monotonic() + end
        while len(exits) < 3 and time.monotonic() < deadline:
            seen.update(*(_tree(a.pid) for a in agents if a.poll() is None))
            now = time.time()
            for index, agent in enumerate(agents):
                delay = run_delay(agent.pid) if agent.poll() is None else None
                if delay is not None:
                    waited[index] = delay
            for pid in {e["pid"] for e in events(work)} - set(gone):
                if not _alive(pid):
                    gone[pid], waited_at_gone = now, dict(waited)
            for index, agent in enumerate(agents):
                if index not in exits and agent.poll() is not None:
                    exits[index] = now
            time.sleep(0.02)
        result.codes = [a.returncode if a.poll() is not None else "running" for a in agents]
        if len(exits) == 3 and gone:
            result.lag = max(exits.values()) - max(gone.values())
            last = max(exits, key=exits.get)
            result.starved = max(0.0, waited.get(last, 0.0) - waited_at_gone.get(last, waited.get(last, 0.0)))
        time.sleep(0.5)  # what a SIGKILLed agent's reaper kills is gone within this
        for log in logs:
            log.flush()
            with open(log.name) as text:
                result.stuck += text.read().count(STUCK_LINE)
        seen |= {e["pid"] for e in events(work)}
        result.leftovers = [" ".join(psutil.Process(p).cmdline())[:90] for p in sorted(seen) if _alive(p)]
        return result
    finally:
        for pid in seen | {a.pid for a in agents}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for agent in agents:
            agent.wait(timeout=30)
        for log in logs:
            log.close()
        if result.ok(fault):
            subprocess.run(["rm", "-rf", work], check=False)
        else:
            print(f"  {fault}/{mode}: codes {result.codes}, leftovers {result.leftovers}; logs in {work}", flush=True)


def cell(trials: list[Trial], fault: str) -> str:
    ended = sum(t.ok(fault) for t in trials)
    left = sum(len(t.leftovers) for t in trials)
    lags = [t.lag for t in trials if t.lag is not None]
    lag = f"{statistics.median(lags):5.2f} / {max(lags):5.2f}" if lags else "    - /     -"
    stuck = sum(t.stuck > 0 for t in trials)
    return f"{ended:>3}/{len(trials):<3} {left:>9} {lag:>15} {stuck:>5}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--faults", default="worker,agent,node,hang")
    parser.add_argument("--modes", default="plain,warm,inprocess")
    parser.add_argument("--end", type=float, default=90.0, help="seconds after the fault for every agent to exit")
    parser.add_argument("--busy", type=int, default=1, help="CPU-bound processes beside the job")
    parser.add_argument("--exit-stuck-timeout", type=float, default=10.0, help="elastic-run's option of that name")
    args = parser.parse_args()
    print(f"3 agents x 1 worker, gloo; {args.trials} trials a cell; {args.busy} busy process(es) beside the job")
    print("exit lag: last worker gone -> last agent exit; stuck: trials in which a worker was stuck at exit")
    print(f"{'fault':<8} {'mode':<10} {'ended':>7} {'leftovers':>9} {'lag med / max s':>15} {'stuck':>5}", flush=True)
    loops = busy(args.busy)
    try:
        with EtcdServer() as etcd:
            for fault in args.faults.split(","):
                for mode in args.modes.split(","):
                    runs = [
                        trial(fault, mode, etcd.endpoints, args.end, args.exit_stuck_timeout)
                        for _ in range(args.trials)
                    ]
                    print(f"{fault:<8} {mode:<10} {cell(runs, fault)}", flush=True)
    finally:
        for loop in loops:
            loop.kill()


if __name__ == "__main__":
    main()
