"""Real agents and workers for the fault suite, and what they left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence

import psutil

from rendezvous import EtcdClient
from rendezvous.etcd.server import EtcdCluster
from tests.e2e.cli_helpers import json_records, python_stacks, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
LIFE = os.path.join(HERE, "workers", "life.py")
TICKER = os.path.join(HERE, "workers", "ticker.py")
ELASTIC_RUN = os.path.join(os.path.dirname(sys.executable), "elastic-run")

# No restart of its own making: these lines mean the job noticed something.
__all__ = [
    "Agent",
    "TICKER",
    "children",
    "death_watch",
    "freeze",
    "thaw",
    "ticks",
    "timeline",
    "DISTURBED",
    "alive",
    "leader_index",
    "member_endpoint",
    "run_id",
    "round_of",
    "signal_member",
    "stuck_story",
    "wait_for",
    "workers",
]

DISTURBED = (
    "re-rendezvous",
    "restarting the workers",
    "resuming the workers in place",
    "no lease renewal",
    "lease expired",
)


def run_id() -> str:
    return f"fault-{uuid.uuid4().hex[:8]}"


class Agent:
    """One elastic-run process whose output goes to a file the test can read at any time."""

    def __init__(
        self,
        endpoints: str,
        rdzv_id: str,
        nnodes: str,
        out: str,
        seconds: float,
        log: str,
        conf: str = "",
        nproc: int = 1,
        worker: Sequence[str] = (),
        options: Sequence[str] = (),
    ) -> None:
        """``worker``: the worker's command (default: life.py OUT SECONDS); ``options``: more elastic-run options."""
        self.log = log
        args = [
            ELASTIC_RUN,
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            str(nproc),
            "--rdzv-endpoint",
            endpoints,
            "--rdzv-id",
            rdzv_id,
            "--local-addr",
            "127.0.0.1",
            "--stop-grace",
            "2",
        ]
        if conf:
            args += ["--rdzv-conf", conf]
        args += [*options, *(worker or (LIFE, out, str(seconds)))]
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a worker sent SIGABRT prints its stacks (``stuck_story``)
        with open(log, "wb") as handle:
            self.process = subprocess.Popen(
                args, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        with open(self.log, errors="replace") as handle:
            return handle.read()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            stacks = python_stacks(self.process.pid)  # where it was, before it is killed
            self.kill()
            raise AssertionError(f"agent did not exit within {timeout}s:\n{self.output()}\n{stacks}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            thaw([self.process.pid, *children(self.process.pid)])  # a frozen node must be able to die
            self.process.kill()
            self.process.wait(10)


def stuck_story(out: str, started: Sequence[Agent]) -> str:
    """What a DDP job that stopped getting anywhere was doing, for a wait that timed out: each worker's
    last timeline event; then its Python stacks, asked for by SIGABRT (the agents' workers run with
    PYTHONFAULTHANDLER: they print every thread's stack and end); then each agent's last lines."""
    last = {event["pid"]: event for event in timeline(out)}
    lines = [f"worker {pid}: rank {e['rank']} of {e['world']}, last {e['event']!r}" for pid, e in last.items()]
    for pid in [pid for pid in last if alive(pid)]:
        lines.append(native_stacks(pid))
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:  # it ended meanwhile (local CI: the story raised instead of being told)
            lines.append(f"worker {pid}: ended before its stacks were asked for")
    time.sleep(2.0)  # the stacks pass through the agent's output pump
    return "\n".join(lines + [f"agent {i}'s last lines:\n{agent.output()[-6000:]}" for i, agent in enumerate(started)])


def native_stacks(pid: int) -> str:
    """Every thread's native stack (gdb, where installed: .ci/run installs it), its top 12 frames:
    where a worker stuck in a library's code waits (its Python stack ends at the call)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return f"worker {pid}: no gdb here for its native stacks"
    try:
        shown = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return f"worker {pid}: gdb did not answer within 60 s"
    kept = [line for line in shown.stdout.splitlines() if line.startswith(("Thread ", "#"))]
    return f"worker {pid} ({_sched_state(pid)})'s native stacks:\n" + "\n".join(line[:200] for line in kept)


def _sched_state(pid: int) -> str:
    """The kernel's view of each of the process's threads: its state letter (R running, S sleeping, D
    in the kernel, T stopped) and where it sleeps -- a stopped worker and a waiting one look alike in
    a stack."""
    found = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int) if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/task/{tid}/wchan") as handle:
                wchan = handle.read().strip()
        except OSError:
            continue
        found.append(f"{tid}:{state}" + (f":{wchan}" if wchan not in ("", "0") else ""))
    return "threads " + " ".join(found) if found else "gone"


def workers(out: str) -> list[dict]:
    """Every worker process the job started, in the order they started."""
    return json_records(out, "w-*.json", "created")


def round_of(out: str, world: int, timeout: float, *, since: float = 0.0) -> list[dict]:
    """The workers of a round of ``world`` started after ``since`` (wall clock), once all ``world``
    of them have started. Counted by their round's size, not in all: a job of 2:3 nodes may begin
    with a round of 2 before its third node arrives (under load), whose workers are records too."""

    def started() -> list[dict] | None:
        these = [w for w in workers(out) if w["world_size"] == world and w["created"] > since]
        return these if len(these) >= world else None

    return wait_for(started, timeout, what=f"a round of {world} workers")


def timeline(out: str) -> list[dict]:
    """The JSON lines the examples' DDP scripts wrote with --timeline ``out``, in time order (a line
    a kill cut short is left out)."""
    found = []
    for name in os.listdir(out):
        if name.endswith(".jsonl"):
            with open(os.path.join(out, name)) as handle:
                found += [json.loads(line) for line in handle if line.endswith("\n")]
    return sorted(found, key=lambda e: e["t"])


def ticks(out: str, pid: int) -> list[float]:
    """The times ticker.py's worker ``pid`` ran (one every 10 ms while it was not frozen)."""
    try:
        with open(os.path.join(out, f"t-{pid}.log")) as handle:
            return [float(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (the agent's reaper and workers), parents before children."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def freeze(pids: Iterable[int]) -> None:
    """SIGSTOP each, in order: a whole node's processes, as a paused VM or a swap storm stops them."""
    _signal_each(pids, signal.SIGSTOP)


def thaw(pids: Iterable[int]) -> None:
    _signal_each(pids, signal.SIGCONT)


def _signal_each(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def death_watch(pid: int) -> list[float]:
    """[time the pid died], filled in by a thread that polls it every 10 ms."""
    died: list[float] = []

    def poll() -> None:
        while alive(pid):
            time.sleep(0.01)
        died.append(time.time())

    threading.Thread(target=poll, daemon=True).start()
    return died


def alive(pid: int) -> bool:
    """Running (a zombie that its parent has not reaped yet counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leader_index(cluster: EtcdCluster) -> int:
    """Which member leads now (asked of each member that answers)."""
    for index, member in enumerate(cluster.members):
        if member.process is None:
            continue
        client = EtcdClient(f"{member.host}:{member.client_port}", timeout=2.0)
        try:
            status = client.status()
            if status.leader == status.header.member_id:
                return index
        except Exception:  # noqa: BLE001 -- a member that does not answer is not the leader we want
            continue
        finally:
            client.close()
    raise AssertionError("no etcd member says it leads")


def member_endpoint(cluster: EtcdCluster, index: int) -> str:
    member = cluster.members[index]
    return f"{member.host}:{member.client_port}"


def signal_member(cluster: EtcdCluster, index: int, signum: int) -> None:
    os.kill(cluster.members[index].process.pid, signum)
