"""Console entry points (pyproject's scripts).

For ``--standalone`` the local etcd is started before the heavy imports (gRPC, click), so that its
start-up overlaps them; the CLI picks the running server up (or stops it if it is not needed). The
workers' warm interpreter is started as early, from the command line as typed (``early``).
"""

from __future__ import annotations

import os
import sys

__all__ = ["run_main", "ctl_main"]


def _asks_standalone(argv: list[str]) -> bool:
    return "--standalone" in argv or os.environ.get("PET_STANDALONE", "").lower() in ("1", "true", "yes")


def run_main() -> None:
    early = None
    if _asks_standalone(sys.argv[1:]):
        try:
            from rendezvous.etcd.server import EtcdServer

            early = EtcdServer().start(wait=False)
        except Exception:  # noqa: BLE001 -- the CLI starts it again and reports any error in one line
            early = None
    try:
        from .early import start_early_warm

        warm = start_early_warm(sys.argv[1:])  # its imports overlap the agent's own
    except Exception:  # noqa: BLE001 -- the agent starts its own, and says why if that fails
        warm = None
    from . import run

    run.run_main(early_etcd=early, early_warm=warm)


def ctl_main() -> None:
    from . import run

    run.ctl_main()
