"""The warm interpreter's CPU priority, seen from its agent: a hot spare's imports run at the lowest
(``SPARE_NICE``), set on the interpreter's other threads and its session's scheduling group
(``renice``), and only where this process may raise it again when workers are asked for
(``may_raise``) does an interpreter that might run the node's first workers start lowered.

Linux keeps a nice value per thread; where the kernel groups the threads of a session (autogroup: a
machine or VM whose processes are in no CPU cgroup of their own), a nice value weighs only against
that session's threads and the group's own nice value weighs against the others'. Lowering either is
anyone's right; raising a thread's again takes CAP_SYS_NICE or an RLIMIT_NICE that reaches it, and
raising a group's back to 0 is anyone's again.
"""

from __future__ import annotations

import os
import resource

__all__ = ["SPARE_NICE", "may_raise", "raisable", "renice"]

SPARE_NICE = 19  # a hot spare's imports: the lowest CPU priority (only while they run)
_CAP_SYS_NICE = 23  # its bit in /proc's CapEff mask


def renice(pid: int, nice: int) -> None:
    """Every thread of the interpreter ``pid`` but its main one (the importing thread, and any it
    started) at ``nice``, and its session's scheduling group (autogroup); what the system refuses (a
    higher priority without the right to it) is left as it is."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    except OSError:
        threads = []
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass
    try:
        with open(f"/proc/{pid}/autogroup", "w") as group:  # its own session's: started with start_new_session
            group.write(str(nice))
    except OSError:
        pass


def may_raise() -> bool:
    """Whether this process may raise a thread it lowered back to its own priority (``raisable``, read
    from /proc and its limits)."""
    capabilities = 0
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    capabilities = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return raisable(capabilities, None if soft == resource.RLIM_INFINITY else soft, os.getpriority(os.PRIO_PROCESS, 0))


def raisable(capabilities: int, nice_limit: int | None, nice: int) -> bool:
    """CAP_SYS_NICE in the effective set ``capabilities`` (root on a host; not root in a container not
    given it), or an RLIMIT_NICE ``nice_limit`` (None: unlimited) whose ceiling, 20 - limit, reaches
    ``nice``, the process's own."""
    return bool(capabilities >> _CAP_SYS_NICE & 1) or nice_limit is None or 20 - nice_limit <= nice
