"""Agents as real processes whose output lines are stamped with the wall time they arrived, and the
steps worker's own record of its heartbeats."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import threading
import time

from tests.e2e.cli_helpers import tool

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = os.path.join(HERE, "workers", "steps.py")
ROUND = re.compile(r"round (\d+): group rank \d+ of \d+ nodes, global ranks (\d+)\.\.(\d+)")


class Agent:
    """``elastic-run`` with its combined output read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """``env``: the agent's whole environment (default: this process's)."""
        self.process = subprocess.Popen(
            [tool("elastic-run"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(f"the agent did not exit within {timeout} s:\n{self.output}") from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> tuple[float, str]:
        """The first line matching ``pattern`` (a regex) and when it arrived."""
        for at, line in self.lines:
            if re.search(pattern, line):
                return at, line
        raise AssertionError(f"no line matches {pattern!r} in:\n{self.output}")

    def count(self, pattern: str) -> int:
        return sum(1 for _, line in self.lines if re.search(pattern, line))

    def ranks(self) -> set[int]:
        """The global ranks this agent ran in its first round."""
        for _, line in self.lines:
            found = ROUND.search(line)
            if found:
                return set(range(int(found.group(2)), int(found.group(3)) + 1))
        return set()

    def node(self, pattern: str) -> str:
        """The node id in the first hang line (``rank R on node N hung``)."""
        return re.search(r"on node (\S+) hung", self.first(pattern)[1]).group(1)


def last_beat(out: str, rank: int, attempt: int = 0) -> float:
    """The wall time of the rank's last heartbeat in that attempt (the worker writes it after each)."""
    with open(os.path.join(out, f"{rank}.{attempt}.beat")) as handle:
        return float(handle.read().strip() or 0)


def done(out: str) -> set[tuple[int, int]]:
    """(rank, attempt) of every worker that finished its loop."""
    found = set()
    for path in glob.glob(os.path.join(out, "*.done")):
        rank, attempt, _ = os.path.basename(path).split(".")
        found.add((int(rank), int(attempt)))
    return found


def steps_args(out: str, *extra: str) -> list[str]:
    return [STEPS, "--out", out, *extra]
