"""``elastic-lighthouse`` and ``python -m lighthouse``: the Lighthouse replica's program."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    # gRPC's own log lines (a port it cannot bind, a client that went away) would come on top of
    # the command's one line; set GRPC_VERBOSITY to see them. Set before gRPC is imported.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from launcher.cli.entry import entry

    from .cli import elastic_lighthouse

    entry(elastic_lighthouse, "elastic-lighthouse", argv)


if __name__ == "__main__":
    main()
