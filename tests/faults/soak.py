"""A randomized fault soak, seeded and replayable: real agents and workers on a real 3-member etcd.

    python -m tests.faults.soak --seed 7 --seconds 300      # by hand (tests/faults/test_soak.py runs a short one)

Four agents (``--nnodes 2:3 --nproc-per-node 2``: one is a hot spare) run ticker.py workers. Every
3-8 s one fault, drawn from the seed: a worker SIGKILLed; an agent's whole process tree SIGKILLed
(and a new agent started in its place); an agent's tree SIGSTOPped for a while (woken workers
first: the worst order); an etcd member SIGKILLed and started again, or SIGSTOPped for a while
(the leader included). Faults overlap, but never more than one etcd member is out at once (etcd
survives one of three) nor more than one agent frozen. Then every fault is healed and the job runs
to its end. The seed decides the faults, their targets and their timing; the processes' own
timing is the machine's.

What must hold (``soak_checks`` for the first two):
- no rank runs in two rounds at once (ticks right after a node woke are reported apart);
- the restart count is the same within a round and never goes back;
- every agent not killed by the soak exits 0 (no agent exits for a fault that etcd survives);
- no process is left: every worker and reaper is gone once the agents are;
- every key the job leaves in etcd is on a lease (it expires by itself).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

from rendezvous import EtcdClient
from rendezvous.etcd.server import EtcdCluster

from .helpers import TICKER, Agent, alive, children, freeze, leader_index, run_id, thaw, ticks, workers
from .soak_checks import Overlap, overlaps, restart_problems, worker_of

__all__ = ["Soak", "SoakReport", "main"]

CONF = "last_call_timeout=1,lease_ttl=5"  # renew deadline 4 s: a freeze of up to 12 s outlasts the lease
WOKEN = 0.25  # seconds a frozen node's worker may run after SIGCONT (the scheduler's choice; seen: ~10 ms)
SETTLE = 20.0  # seconds the job runs after the last fault, healed, before its workers end


@dataclass
class SoakReport:
    seed: int
    faults: list[str] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    restart_problems: list[str] = field(default_factory=list)
    bad_exits: list[str] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    unleased: list[str] = field(default_factory=list)
    rounds: int = 0
    workers: int = 0

    @property
    def split_brain(self) -> list[Overlap]:
        return [o for o in self.overlaps if not o.woken]

    def problems(self) -> list[str]:
        return (
            [str(o) for o in self.split_brain]
            + self.restart_problems
            + self.bad_exits
            + [f"process {pid} outlived its agent" for pid in self.left]
            + [f"key {key} is on no lease" for key in self.unleased]
        )

    def summary(self) -> str:
        woken = [o for o in self.overlaps if o.woken]
        most = max((o.after_wake for o in woken), default=0.0)
        return (
            f"soak seed {self.seed}: {len(self.faults)} faults, {self.rounds} rounds, {self.workers} workers; "
            f"split-brain window {max((o.seconds for o in self.split_brain), default=0.0) * 1000:.0f} ms; "
            f"{len(woken)} stale workers ticked in the {most * 1000:.1f} ms after their frozen node woke; "
            f"{len(self.problems())} problems"
        )


class Soak:
    def __init__(self, cluster: EtcdCluster, workdir: str, seed: int, seconds: float, freeze_max: float = 12.0) -> None:
        self.cluster, self.workdir, self.seed, self.seconds = cluster, workdir, seed, seconds
        self.rng = random.Random(seed)
        self.freeze_max = freeze_max
        self.run_id = run_id()
        self.out = os.path.join(workdir, "out")
        os.makedirs(self.out, exist_ok=True)
        self.agents: list[Agent] = []
        self.killed: set[int] = set()  # agent pids the soak killed
        self.frozen: dict[int, list[int]] = {}  # agent pid -> its frozen tree
        self.member_out: int | None = None  # the etcd member killed or frozen now
        self.woken: dict[int, list[float]] = {}  # agent pid -> when its tree was woken
        self.helpers: set[int] = set()  # reapers seen
        self.events: list[tuple[float, int, str, tuple]] = []  # (due, seq, action, args)
        self._first: list[str] | None = None  # the kinds still to come once each (None: not drawn yet)
        self.report = SoakReport(seed)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> SoakReport:
        job_seconds = self.seconds + SETTLE + 5
        for _ in range(4):
            self._start_agent(job_seconds)
        deadline = time.monotonic() + 60
        while len(workers(self.out)) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        end = time.monotonic() + self.seconds
        next_fault = time.monotonic() + self.rng.uniform(3, 8)
        while time.monotonic() < end:
            self._due(time.monotonic())
            self._note_helpers()
            if time.monotonic() >= next_fault:
                self._fault(job_seconds)
                next_fault = time.monotonic() + self.rng.uniform(3, 8)
            time.sleep(0.05)
        self._due(float("inf"))  # heal everything now
        self._finish()
        return self.report

    def _start_agent(self, job_seconds: float) -> None:
        log = os.path.join(self.workdir, f"agent{len(self.agents)}.log")
        worker = (TICKER, self.out, str(job_seconds))
        opts = ("--max-restarts", "1000")
        agent = Agent(
            self.cluster.endpoints, self.run_id, "2:3", self.out, job_seconds, log, CONF, 2, worker=worker, options=opts
        )
        self.agents.append(agent)

    def _schedule(self, after: float, action: str, *args) -> None:
        heapq.heappush(self.events, (time.monotonic() + after, len(self.report.faults), action, args))

    def _due(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            _, _, action, args = heapq.heappop(self.events)
            getattr(self, action)(*args)

    def _note_helpers(self) -> None:
        known = self._worker_pids()
        for agent in self._live_agents():
            self.helpers.update(p for p in children(agent.pid) if p not in known)

    def _worker_pids(self) -> set[int]:
        return {w["pid"] for w in workers(self.out)}

    def _live_agents(self) -> list[Agent]:
        return [a for a in self.agents if a.process.poll() is None and a.pid not in self.killed]

    # -- the faults -----------------------------------------------------------------------------
    def _fault(self, job_seconds: float) -> None:
        """The next fault: the five kinds once each in an order the seed draws (so that a short soak
        has them all), then any; an etcd member only while no other is out."""
        kinds = ["kill_worker", "kill_agent", "freeze_agent", "kill_member", "freeze_member"]
        if self._first is None:
            self._first = self.rng.sample(kinds, len(kinds))
        kind = self._first.pop(0) if self._first else self.rng.choice(kinds)
        if kind.endswith("member") and self.member_out is not None:
            kind = "kill_worker"
        getattr(self, kind)(job_seconds)

    def _say(self, line: str) -> None:
        self.report.faults.append(line)
        print(f"soak {time.strftime('%H:%M:%S')}: {line}", flush=True)

    def _pick_agent(self) -> Agent | None:
        candidates = [a for a in self._live_agents() if a.pid not in self.frozen]
        return self.rng.choice(candidates) if candidates else None

    def kill_worker(self, job_seconds: float) -> None:
        known = self._worker_pids()
        running = [
            (agent, pid)
            for agent in self._live_agents()
            if agent.pid not in self.frozen
            for pid in sorted(set(children(agent.pid)) & known)
            if alive(pid)
        ]
        if not running:
            return self._say("a worker SIGKILLed: none running")
        agent, pid = self.rng.choice(running)
        os.kill(pid, signal.SIGKILL)
        self._say(f"worker {pid} of agent {agent.pid} SIGKILLed")

    def kill_agent(self, job_seconds: float) -> None:
        agent = self._pick_agent()
        if agent is None:
            return
        tree = [agent.pid, *children(agent.pid)]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.killed.add(agent.pid)
        self._say(f"agent {agent.pid} and its tree SIGKILLed (a machine lost); a new agent comes")
        self._schedule(self.rng.uniform(0.5, 3.0), "_start_agent", job_seconds)

    def freeze_agent(self, job_seconds: float) -> None:
        if self.frozen:
            return self.kill_worker(job_seconds)
        agent = self._pick_agent()
        if agent is None:
            return
        tree = [agent.pid, *children(agent.pid)]
        freeze(tree)
        self.frozen[agent.pid] = tree
        seconds = self.rng.uniform(2.0, self.freeze_max)
        self._say(f"agent {agent.pid} and its tree SIGSTOPped for {seconds:.1f} s")
        self._schedule(seconds, "_thaw_agent", agent.pid)

    def _thaw_agent(self, pid: int) -> None:
        tree = self.frozen.pop(pid, [])
        self.woken.setdefault(pid, []).append(time.time())
        thaw(reversed(tree))

    def kill_member(self, job_seconds: float) -> None:
        index = self._member()
        os.kill(self.cluster.members[index].process.pid, signal.SIGKILL)
        self.member_out = index
        self._say(f"etcd member m{index} SIGKILLed")
        self._schedule(self.rng.uniform(1.0, 5.0), "_restart_member", index)

    def _restart_member(self, index: int) -> None:
        self.cluster.start_member(index, wait=False)
        self.member_out = None

    def freeze_member(self, job_seconds: float) -> None:
        index = self._member()
        os.kill(self.cluster.members[index].process.pid, signal.SIGSTOP)
        self.member_out = index
        seconds = self.rng.uniform(2.0, 12.0)
        self._say(f"etcd member m{index} SIGSTOPped for {seconds:.1f} s")
        self._schedule(seconds, "_thaw_member", index)

    def _thaw_member(self, index: int) -> None:
        os.kill(self.cluster.members[index].process.pid, signal.SIGCONT)
        self.member_out = None

    def _member(self) -> int:
        """The leader half the time (from the seed), else another member."""
        if self.rng.random() < 0.5:
            try:
                return leader_index(self.cluster)
            except AssertionError:
                pass
        return self.rng.randrange(3)

    # -- the end ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        report = self.report
        for agent in self.agents:
            if agent.pid in self.killed:
                continue
            try:
                code = agent.process.wait(SETTLE + 90)
            except Exception:  # noqa: BLE001 -- subprocess.TimeoutExpired: said below
                code = None
            if code != 0:
                report.bad_exits.append(f"agent {agent.pid} exited {code}: ...{agent.output()[-1500:]}")
        time.sleep(3.0)  # init reaps the orphans of killed agents a little late
        records = workers(self.out)
        found = [worker_of(r, ticks(self.out, r["pid"])) for r in records]
        report.workers, report.rounds = len(found), len({w.round for w in found})
        report.overlaps = overlaps(found, self.woken, WOKEN)
        report.restart_problems = restart_problems(found)
        report.left = sorted(p for p in {r["pid"] for r in records} | self.helpers if alive(p))
        client = EtcdClient(self.cluster.endpoints)
        try:
            kvs, _ = client.get_prefix(f"/elastic/{self.run_id}/")
            report.unleased = [kv.key.decode(errors="replace") for kv in kvs if not kv.lease]
        finally:
            client.close()

    def close(self) -> None:
        for agent in self.agents:
            agent.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a seeded fault soak of elastic-run on a 3-member etcd")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--freeze-max", type=float, default=25.0, help="longest freeze of an agent's tree (s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="elastic-soak-") as workdir, EtcdCluster(3) as cluster:
        soak = Soak(cluster, workdir, args.seed, args.seconds, args.freeze_max)
        try:
            report = soak.run()
        finally:
            soak.close()
    for overlap in report.overlaps:
        print(overlap)
    for problem in report.problems():
        print(f"PROBLEM: {problem}")
    print(report.summary())
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
