"""One two-node job with a worker SIGKILLed, under four launchers side by side in one run.

    python bench/launchers.py [--trials 1] [--steps 400] [--wait 60] [--launchers a,b]

The same script (examples/ddp_steps.py: gloo, one worker per node, a save every 50 steps) runs to
--steps under each launcher with --nnodes 2 --nproc-per-node 1 --max-restarts 3:

- torchrun, c10d backend (the endpoint a free port on this machine);
- torchrun, etcd-v3 backend (this package's handler; the same etcd as elastic-run's);
- accelerate launch through the handler, by docs/clients.md's recipe (PET_RDZV_ENDPOINT,
  PET_RDZV_ID, --same_network), when accelerate is installed;
- elastic-run on the same etcd.

Once the job has run 150 steps, the worker of global rank 1 is SIGKILLed. Printed per launcher: the
seconds from the kill to the first step done by a process started after it ("-" when none came
within --wait), whether every agent ended by itself (within --wait after the resumption, or after
the kill when there was none) and with which exit codes, and the processes of the job still alive
once its agents ended (leftovers). Every job must end; the handler's path must be no worse than
c10d's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from bench.recovery import SCRIPT, WARM_STEPS, Node, children, events, wait_until, worker_of  # noqa: E402
from rendezvous import EtcdServer  # noqa: E402
from rendezvous.etcd.server import free_port  # noqa: E402

BIN = os.path.dirname(sys.executable)
COMMON = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3"]
LAUNCHERS = ("torchrun c10d", "torchrun etcd-v3", "accelerate", "elastic-run")


@dataclass
class Outcome:
    resumed: float | None  # seconds from the kill to the first step of a new process
    codes: list[int | None]  # each agent's exit code (None: still running at the deadline)
    ended_in: float | None  # seconds from the kill to the last agent's end (None: not all ended)
    leftovers: int | None  # the job's processes alive after its agents ended (None: they did not end)


def _argv(launcher: str, etcd: str, run_id: str, work: str, steps: int, rank: int, port: int) -> list[str]:
    script = [SCRIPT, "--steps", str(steps), "--checkpoint", os.path.join(work, "save.pt"), "--timeline", work]
    rdzv = ["--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=1"]
    if launcher == "torchrun c10d":
        endpoint = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-backend", "c10d"]
        return [sys.executable, "-m", "torch.distributed.run", *COMMON, *endpoint, *rdzv, *script]
    if launcher == "torchrun etcd-v3":
        endpoint = ["--rdzv-endpoint", etcd, "--rdzv-backend", "etcd-v3"]
        return [sys.executable, "-m", "torch.distributed.run", *COMMON, *endpoint, *rdzv, *script]
    if launcher == "accelerate":  # docs/clients.md's recipe: the endpoint and id in PET_* (see _env)
        machine = ["--multi_gpu", "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", "2"]
        main = ["--same_network", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
        return [
            os.path.join(BIN, "accelerate"),
            "launch",
            *machine,
            *main,
            "--rdzv_backend",
            "etcd-v3",
            "--max_restarts",
            "3",
            "--monitor_interval",
            "0.1",
            *script,
        ]
    return [os.path.join(BIN, "elastic-run"), *COMMON, "--rdzv-endpoint", etcd, *rdzv, *script]


def _env(launcher: str, etcd: str, run_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "ACCELERATE_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if launcher == "accelerate":
        env.update(PET_RDZV_ENDPOINT=etcd, PET_RDZV_ID=run_id)
    return env


def _job_processes(agents: list[Node], work: str) -> set[int]:
    return {e["pid"] for e in events(work)} | {pid for node in agents for pid in children(node.process.pid)}


def _alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def trial(launcher: str, etcd: str, steps: int, wait: float) -> Outcome:
    work, run_id, port = tempfile.mkdtemp(prefix="bench-launchers-"), f"launchers-{uuid.uuid4().hex[:8]}", free_port()
    agents = []
    for rank in range(2):
        argv = _argv(launcher, etcd, run_id, work, steps, rank, port)
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(launcher, etcd, run_id),
            start_new_session=True,
        )
        agents.append(Node(process))
        threading.Thread(target=agents[-1].read, daemon=True).start()
    seen: set[int] = set()
    try:
        warm = lambda: any(e["event"] == "step" and e["step"] >= WARM_STEPS for e in events(work))  # noqa: E731
        if not wait_until(warm, 120):
            raise RuntimeError(f"{launcher}: the job did not reach step {WARM_STEPS}")
        seen = _job_processes(agents, work)
        victim, when = worker_of(work, 1), time.time()
        os.kill(victim, signal.SIGKILL)
        old = {e["pid"] for e in events(work) if e["t"] < when}
        new_step = lambda: next((e for e in events(work) if e["event"] == "step" and e["pid"] not in old), None)  # noqa: E731
        resumed = new_step()["t"] - when if wait_until(lambda: new_step() is not None, wait) else None
        wait_until(lambda: all(node.process.poll() is not None for node in agents), wait)
        codes = [node.process.poll() for node in agents]
        ended_in = time.time() - when if None not in codes else None
        seen |= _job_processes(agents, work)
        time.sleep(2.0)  # what the agents left behind has had time to go
        return Outcome(resumed, codes, ended_in, len(_alive(seen)) if ended_in is not None else None)
    finally:
        for node in agents:
            try:
                os.killpg(node.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.process.wait(timeout=30)
        for pid in _alive(seen | {e["pid"] for e in events(work)}):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


def _row(name: str, outcome: Outcome) -> str:
    resumed = f"{outcome.resumed:8.2f}" if outcome.resumed is not None else f"{'-':>8}"
    ended = f"{outcome.ended_in:6.1f} s" if outcome.ended_in is not None else "  never"
    codes = ",".join("-" if code is None else str(code) for code in outcome.codes)
    leftovers = "-" if outcome.leftovers is None else str(outcome.leftovers)
    return f"{name:<18} {resumed}   {ended}   exit {codes:<6} {leftovers:>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--steps", type=int, default=400, help="steps the job runs to (the kill comes at 150)")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a resumption, then an end")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="which rows, comma-separated")
    args = parser.parse_args()
    launchers = [name for name in LAUNCHERS if name in args.launchers.split(",")]
    if "accelerate" in launchers and shutil.which("accelerate", path=BIN) is None:
        launchers.remove("accelerate")
        print("accelerate is not installed: its row is left out (pip install -e '.[clients]')")
    print(
        f"2 nodes x 1 worker on {socket.gethostname()}, gloo, {os.path.basename(SCRIPT)} to step {args.steps}; "
        f"global rank 1's worker SIGKILLed at step {WARM_STEPS}"
    )
    print(f"{'launcher':<18} {'resumed':>8}   {'ended':>8}   {'exit codes':<11} {'leftovers':>9}")
    with EtcdServer() as etcd:
        for _ in range(args.trials):
            for launcher in launchers:
                print(_row(launcher, trial(launcher, etcd.endpoints, args.steps, args.wait)), flush=True)


if __name__ == "__main__":
    main()
