"""Console entry points (pyproject's scripts).

For ``--standalone`` the local etcd is started before the heavy imports (gRPC, click), so that its
start-up overlaps them; the CLI picks the running server up (or stops it if it is not needed). The
workers' warm interpreter is started as early. Both read the command line as typed, once
(``early.read_line``, the option table's exact spellings; a line that is not that plain starts
neither early, and the CLI starts them in their turn).
"""

from __future__ import annotations

import sys

__all__ = ["run_main", "ctl_main"]


def run_main() -> None:
    from .early import read_line, start_early_warm

    line, early = read_line(sys.argv[1:]), None  # the line as typed, read once for what starts early
    if line is not None and line.standalone:
        try:
            from rendezvous.etcd.server import EtcdServer

            early = EtcdServer().start(wait=False)
        except Exception:  # noqa: BLE001 -- the CLI starts it again and reports any error in one line
            early = None
    try:
        warm = start_early_warm(line)  # its imports overlap the agent's own
    except Exception:  # noqa: BLE001 -- the agent starts its own, and says why if that fails
        warm = None
    from . import run

    run.run_main(early_etcd=early, early_warm=warm)


def ctl_main() -> None:
    from . import run

    run.ctl_main()
