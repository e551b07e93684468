"""Child processes: started so that they die with their parent, without running Python code after
fork (``die_with_parent``, ``start_process``), stopped (``stop_process``), and how one ended. Generic
helpers of the project's programs (the bundled etcd, the reaper, the warm interpreter, the workers,
the Lighthouse replica), kept out of the etcd client.

``subprocess``'s ``preexec_fn`` is unsafe in a process that runs gRPC threads, so the parent-death
signal is set by ``setpriv --pdeathsig`` (util-linux), which then execs a one-line ``sh`` that
execs the real program in place: same pid, no Python in between. The signal is tied to the
*thread* that forked the child, so start long-lived children from a thread that lives as long as
the process (the main thread). It comes only for a death after it was set: a parent killed between
the fork and setpriv's ``prctl`` would leave the child running alone, so the ``sh`` first compares
its parent with the pid of the process that built the command, and ends itself if they differ.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["die_with_parent", "ended_by", "start_process", "stop_process"]

_STOP_GRACE = 5.0  # seconds from SIGTERM to SIGKILL


def die_with_parent(argv: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """``argv`` wrapped so the child gets SIG``signal_name`` when its parent dies (Linux only). The
    parent is the *thread* that starts it (PR_SET_PDEATHSIG): start it from a thread that lives as
    long as the child should, never from a short-lived one (a timer's)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    still_ours = f'[ "$PPID" = "$0" ] || {{ kill -s {signal_name} $$; exit 1; }}; exec "$@"'  # $0: our pid
    return [setpriv, "--pdeathsig", signal_name, "--", "/bin/sh", "-c", still_ours, str(os.getpid()), *argv]


def ended_by(returncode: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL``: how a process ended, from its return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def start_process(
    command: list[str], log_path: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.Popen:
    """``command`` in a session of its own (no terminal signal reaches it), dying with the thread
    that starts it (``die_with_parent``), its output appended to ``log_path``; ``env``: its
    environment (None: this process's); ``cwd``: its working directory (None: this process's)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            die_with_parent(command, "TERM"),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )


def stop_process(process: subprocess.Popen, grace: float = _STOP_GRACE) -> None:
    """SIGTERM, then SIGKILL if it is still there ``grace`` seconds later."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=_STOP_GRACE)
