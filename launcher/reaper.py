"""The reaper: a tiny process that kills the agent's worker process groups if the agent dies.

The agent starts it with a pipe on its stdin and writes ``+PGID`` / ``-PGID`` lines as worker
groups start and stop. When the pipe reaches EOF -- the agent exited, however it exited -- every
process group still registered gets SIGKILL. This covers what a parent-death signal does not:
grandchildren of the workers (data loaders, shells) in the same process group.

Run by path with ``python -I -S``: standard library only, nothing to import from the project.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    for name in ("SIGINT", "SIGHUP", "SIGTERM", "SIGPIPE"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if len(line) < 2 or not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if line[0] == "+":
            groups.add(pgid)
        elif line[0] == "-":
            groups.discard(pgid)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
