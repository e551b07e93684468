"""Child processes that die with their parent, without running Python code after fork.

``subprocess``'s ``preexec_fn`` is unsafe in a process that runs gRPC threads, so the parent-death
signal is set by ``setpriv --pdeathsig`` (util-linux), which then execs the real program in place:
same pid, no Python in between. The signal is tied to the *thread* that forked the child, so start
long-lived children from a thread that lives as long as the process (the main thread).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

__all__ = ["die_with_parent"]


def die_with_parent(argv: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """``argv`` wrapped so the child gets SIG``signal_name`` when its parent dies (Linux only)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", signal_name, "--", *argv]
