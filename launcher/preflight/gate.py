"""The agent's side of the pre-flight check (``--preflight``): whether a round needs it, running
``probe`` in the workers' environment, and what its findings mean for this node.

A round needs the check when any of its participants was not in the round before: every node of the
job's first round, a node that came later (a machine slow to start comes late), a spare taken in.
The frozen state names them (its cause's ``joining``: ``rendezvous.rounds.decide.formed_cause``), so
every node of the round decides alike. The check runs after the round's store
is served and before any worker starts; its findings are the same on every node. When they name
nodes and the job stays at or above its minimum without them, the named nodes step out and leave
the job (exit 200: a machine to replace), and the others form the round again without them (a
membership change, no restart used); else the job runs as it is, and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launcher.warmstart.starters import PlainStart
from rendezvous.errors import RendezvousError
from rendezvous.job.history import Kind
from rendezvous.job.state import JobState

from .pairs import ENV, Finding

__all__ = ["Preflight", "Verdict", "MIB", "TIMEOUT", "preflight_for", "check_round"]

MIB = 16  # the all-reduce's size in MiB on CPU (64 on a GPU)
TIMEOUT = 10.0  # seconds each of the check's waits takes at most (a partner that never came)
LIMIT = 60.0  # seconds the whole check takes at most


@dataclass(frozen=True)
class Verdict:
    """What the check found: its figures and findings, and what this node does about them."""

    findings: tuple[Finding, ...]
    figures: dict
    seconds: float  # the check itself, from every node's program past its imports to the findings
    out: tuple[int, ...]  # group ranks that leave (empty: the job runs as it is)

    def summary(self) -> dict:
        """The history record's details (group rank 0 records it)."""
        first = [v for v in self.figures.get("first", {}).values() if v is not None]
        return {
            "seconds": round(self.seconds, 3),
            "nodes": len(self.figures.get("matmul", {})),
            "slowest_pair_ms": round(max(first) * 1000, 1) if first else None,
            "findings": [f.line() for f in self.findings][:8],
            "excluded": list(self.out),
        }


def decide(findings: list[Finding], nodes: int, min_nodes: int) -> tuple[int, ...]:
    """The group ranks that leave: every node named, unless the job would fall below ``min_nodes``."""
    named = tuple(sorted({f.node for f in findings}))
    return named if named and nodes - len(named) >= min_nodes else ()


def _figures(raw: dict) -> dict:
    """The result file's figures with integer ranks (JSON keys are strings)."""
    return {
        name: {int(rank): value for rank, value in raw.get(name, {}).items()}
        for name in ("matmul", "first", "second", "third")
    }


class Preflight:
    def __init__(self, start: Callable[[list[str], Mapping[str, str]], object], say: Callable[[str], None]) -> None:
        """``start(argv, env)``: a started process with ``wait(timeout)`` and ``kill()`` (the warm
        interpreter's fork, or a plain one)."""
        self._start, self._say = start, say

    @staticmethod
    def needed(state: JobState) -> bool:
        """Whether the round ``state`` (frozen) is checked: nodes joined it (all of the job's first)."""
        return bool(state.cause.joining)

    def run(self, settings: dict, environ: Mapping[str, str], min_nodes: int) -> Verdict:
        """Run the check with this round's ``settings`` (round, rank, nodes, addr, port): its verdict."""
        fd, out = tempfile.mkstemp(prefix="elastic-preflight-", suffix=".json")
        os.close(fd)
        os.unlink(out)
        env = {**environ, ENV: json.dumps({**settings, "mib": MIB, "timeout": TIMEOUT, "out": out})}
        started = time.monotonic()
        process = self._start([sys.executable, "-u", "-m", "launcher.preflight.probe"], env)
        try:
            process.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        try:
            with open(out) as handle:
                raw = json.load(handle)
            os.unlink(out)
        except (OSError, ValueError):
            raw = {}
        took = time.monotonic() - started  # with the warm interpreter's imports, which the workers wait for too
        seconds = raw.get("seconds", took) if isinstance(raw.get("seconds"), (int, float)) else took
        findings = [Finding(f["rank"], f["kind"], f["why"]) for f in raw.get("findings", [])]
        if not raw:
            findings = [Finding(settings["rank"], "faulty", "its pre-flight check did not finish")]
        verdict = Verdict(tuple(findings), _figures(raw), seconds, decide(findings, settings["nodes"], min_nodes))
        self._say(self.line(verdict, min_nodes))
        return verdict

    @staticmethod
    def line(verdict: Verdict, min_nodes: int) -> str:
        if not verdict.findings:
            return f"pre-flight check passed in {verdict.seconds:.1f} s"
        named = "; ".join(f.line() for f in verdict.findings)
        if verdict.out:
            return f"pre-flight check ({verdict.seconds:.1f} s): {named}: excluded before training"
        return f"pre-flight check ({verdict.seconds:.1f} s): {named}: kept (the job would fall below {min_nodes} nodes)"


def preflight_for(enabled: bool, warm, say: Callable[[str], None]) -> Preflight | None:
    """The agent's check (None without --preflight): its program forked from the warm interpreter
    when there is one (torch already imported), else started fresh; its output is the agent's."""
    if not enabled:
        return None

    def start(argv: list[str], env: Mapping[str, str]):
        if warm is not None and warm.can_start():
            return warm.spawn(argv, env, sys.stdout.fileno(), sys.stderr.fileno())
        return PlainStart().start(argv, env, None, None)  # as a worker: a session, and dies with the agent

    return Preflight(start, say)


def check_round(preflight: Preflight, handler, info, environ: Mapping[str, str], history) -> str | None:
    """The check for round ``info`` when one of its nodes was not in the last check: None when the
    workers start; "" when other nodes were named (the round forms again without them); else this
    node's finding (it stepped out, and leaves the job)."""
    try:
        state = handler.job_state()
    except RendezvousError:
        return None  # etcd away: no check; the fence deals with the rest
    if state is None or not preflight.needed(state):
        return None
    settings = {"round": info.round, "rank": info.group_rank, "nodes": info.group_world_size}
    settings.update(addr=info.master_addr, port=info.master_port)
    verdict = preflight.run(settings, environ, info.min_nodes)
    if info.group_rank == 0:
        history.record(Kind.PREFLIGHT, info.round, **verdict.summary())
    if info.group_rank in verdict.out:
        line = next(f.line() for f in verdict.findings if f.node == info.group_rank)
        handler.step_out(f"pre-flight check: {line}")
        return line
    return "" if verdict.out else None
