"""How one worker process starts: the group asks a ``Starter`` for ``start(argv, env, stdout,
stderr) -> process`` and knows no more. ``stdout``/``stderr`` are what ``subprocess`` takes (a
descriptor, a file, ``subprocess.DEVNULL``), not closed here; the process answers ``pid``,
``poll()``, ``wait()`` and ``returncode`` as a ``Popen`` does.

- ``PlainStart``: a fresh process from the agent's main thread (no Python code runs between fork and
  exec, which matters in a process with gRPC threads), in a session of its own, with a parent-death
  signal (``setpriv --pdeathsig KILL``) unless told not to.
- ``WarmStart``: forked by the warm interpreter (``warm.WarmStarter``) when it can fork this command:
  the program it preloaded for, once its imports are done. Anything else -- a command with a CPU
  binding in front, an interpreter that cannot fork safely or died meanwhile (said once) -- starts
  plainly.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from rendezvous.processes import die_with_parent

from .interpreter import WarmProcess, WarmStarter

__all__ = ["Process", "Starter", "PlainStart", "WarmStart", "starter_for"]

Process = subprocess.Popen | WarmProcess


class Starter(Protocol):
    def start(self, argv: Sequence[str], env: Mapping[str, str], stdout, stderr) -> Process: ...


class PlainStart:
    def __init__(self, lifeline: bool = True) -> None:
        self._lifeline = lifeline

    def start(self, argv: Sequence[str], env: Mapping[str, str], stdout, stderr) -> subprocess.Popen:
        command = die_with_parent(list(argv), "KILL") if self._lifeline else list(argv)
        return subprocess.Popen(
            command,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
        )


class WarmStart:
    def __init__(self, warm: WarmStarter, program: Sequence[str], plain: PlainStart) -> None:
        self._warm, self._program, self._plain = warm, list(program), plain

    def start(self, argv: Sequence[str], env: Mapping[str, str], stdout, stderr) -> Process:
        if list(argv) == self._program and self._warm.can_start():
            process = self._fork(env, stdout, stderr)
            if process is not None:
                return process
        return self._plain.start(argv, env, stdout, stderr)

    def _fork(self, env: Mapping[str, str], stdout, stderr) -> WarmProcess | None:
        """Forked, given ``subprocess``'s stdout/stderr as descriptors (None: the interpreter died
        since it said it could)."""
        with open(os.devnull, "wb") as null:

            def descriptor(target) -> int:
                if target == subprocess.DEVNULL:
                    return null.fileno()
                return target if isinstance(target, int) else target.fileno()

            try:
                return self._warm.spawn(self._program, env, descriptor(stdout), descriptor(stderr))
            except OSError:
                self._warm.can_start()  # says once why warm starts are off
                return None


def starter_for(warm: WarmStarter | None, program: Sequence[str], lifeline: bool = True) -> Starter:
    """Warm starts where a warm interpreter runs, else plain ones."""
    plain = PlainStart(lifeline)
    return plain if warm is None else WarmStart(warm, program, plain)
