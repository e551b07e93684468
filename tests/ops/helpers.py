"""Talking to an agent's HTTP endpoint as a kubelet or Prometheus would."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PHASED = os.path.join(HERE, "workers", "phased.py")


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body); (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def endpoint_of(lines: list[tuple[float, str]], timeout: float = 30) -> str:
    """The ``host:port`` the agent said its endpoint listens on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, line in list(lines):
            found = re.search(r"metrics and probes on http://(\S+) \(", line)
            if found:
                return found.group(1)
        time.sleep(0.05)
    raise AssertionError("the agent never said where its endpoint listens:\n" + "\n".join(line for _, line in lines))


def until(url: str, status: int, words: str, timeout: float) -> str:
    """Poll ``url`` until it answers ``status`` with ``words`` in the body; the body."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = get(url)
        if seen[0] == status and words in seen[1]:
            return seen[1].strip()
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered {status} with {words!r} within {timeout} s; last: {seen}")
