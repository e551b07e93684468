"""Child processes that die with their parent, without running Python code after fork; and how one ended.

``subprocess``'s ``preexec_fn`` is unsafe in a process that runs gRPC threads, so the parent-death
signal is set by ``setpriv --pdeathsig`` (util-linux), which then execs the real program in place:
same pid, no Python in between. The signal is tied to the *thread* that forked the child, so start
long-lived children from a thread that lives as long as the process (the main thread).
"""

from __future__ import annotations

import shutil
import signal
import sys
from collections.abc import Sequence

__all__ = ["die_with_parent", "ended_by"]


def die_with_parent(argv: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """``argv`` wrapped so the child gets SIG``signal_name`` when its parent dies (Linux only)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", signal_name, "--", *argv]


def ended_by(returncode: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL``: how a process ended, from its return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"
