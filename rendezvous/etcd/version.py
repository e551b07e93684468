"""Which etcd a job talks to, and whether to say something about it.

etcd-elastic speaks etcd's v3 API and is tested on etcd 3.4 (Debian's etcd-server) and 3.5 (the
bundled binary, and the compose file's image); 3.6 serves the same v3 API. Two cases are worth a
line when a node first reaches etcd (the Status call):

- 3.5.0 to 3.5.2: etcd's maintainers advise against them in production -- a data-inconsistency bug
  fixed in 3.5.3 can leave members with different data after a crash;
- older than 3.4, the oldest release the suite runs against.

The etcd that an agent starts itself (``--standalone``, a c10d line's host) lives for one job on
one machine and is not checked; ``--standalone`` and ``elastic-ctl etcd`` run the newest etcd they
find (``newest_binary``) and say which.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from typing import Any

from rendezvous.errors import RendezvousError

__all__ = ["OLDEST", "parse_version", "version_line", "server_version", "binary_version", "newest_binary"]

OLDEST = (3, 4, 0)  # the oldest etcd the suite runs against (Debian's 3.4.23)
_INCONSISTENT = ((3, 5, 0), (3, 5, 3))  # etcd's advisory: 3.5.0-3.5.2 are not for production

Version = tuple[int, int, int]


def parse_version(text: str | None) -> Version | None:
    """``3.5.17`` (or ``etcd Version: 3.5.17``, ``v3.6.0-rc.1``) -> (3, 5, 17); None when there is none."""
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def version_line(version: str | None, where: str) -> str | None:
    """One line about the etcd at ``where`` when its ``version`` is worth one, else None."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    low, fixed = _INCONSISTENT
    if low <= parsed < fixed:
        return (
            f"etcd at {where} is {version}: etcd's maintainers advise against 3.5.0-3.5.2 in production "
            "(a data-inconsistency bug after a member crashes, fixed in 3.5.3); upgrade the cluster"
        )
    if parsed < OLDEST:
        return (
            f"etcd at {where} is {version}, older than 3.4, the oldest etcd-elastic is tested on; upgrade the cluster"
        )
    return None


def server_version(client: Any) -> str | None:
    """The version the etcd behind ``client`` says in its Status answer (None: it did not answer)."""
    try:
        return str(client.status().version)
    except RendezvousError:
        return None


def binary_version(binary: str) -> Version | None:
    """What ``binary --version`` says (None: it did not say, or could not run)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out)


def newest_binary(candidates: Iterable[str]) -> tuple[str, Version | None] | None:
    """The candidate whose version is highest (the first of equals; one that says none comes last)."""
    best: tuple[str, Version | None] | None = None
    for binary in candidates:
        version = binary_version(binary)
        if best is None or (version is not None and (best[1] is None or version > best[1])):
            best = (binary, version)
    return best
