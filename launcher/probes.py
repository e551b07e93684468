"""The agent's HTTP endpoint (``--http-port``): ``/metrics`` for Prometheus, ``/healthz`` and
``/readyz`` for a kubelet's probes. Off unless a port is given; served from a thread of its own,
so a slow scrape never slows the agent's loop.

- ``/healthz`` (liveness): the agent's loop is turning (it looked at its workers or at the
  rendezvous within ``STALL`` seconds) and, once it holds a lease, the lease was renewed within the
  renew deadline. 200 ``ok: ...`` or 503 with the reason.
- ``/readyz`` (readiness): its workers run in a frozen round. 200 or 503 with the state.
- ``/metrics``: prometheus-client's exposition of ``launcher.metrics``.
Anything else is 404; a method other than GET or HEAD is 405. Answers are one line of plain text.
"""

from __future__ import annotations

import http.server
import socket
import threading
from dataclasses import dataclass
from typing import Callable

__all__ = ["AgentSnapshot", "liveness", "readiness", "ProbeServer", "STALL"]

STALL = 30.0  # seconds without a turn of the agent's loop after which it is not live


@dataclass(frozen=True)
class AgentSnapshot:
    """What the probes judge, read from the agent at the time of the request."""

    state: str
    since_turn: float  # seconds since the agent's loop last turned
    round: int | None
    world_size: int | None
    group_rank: int | None
    has_lease: bool
    lease_age: float  # seconds since the last acknowledged renewal was sent
    renew_deadline: float
    workers_running: int


def liveness(s: AgentSnapshot) -> tuple[bool, str]:
    if s.since_turn > STALL:
        return False, f"not live: the agent's loop has not turned for {s.since_turn:.1f} s (state {s.state})"
    if s.has_lease and s.lease_age > s.renew_deadline:
        return False, (f"not live: no lease renewal for {s.lease_age:.1f} s (renew deadline {s.renew_deadline:g} s); "
                       "the workers are fenced")
    lease = f", lease renewed {s.lease_age:.1f} s ago" if s.has_lease else ""
    return True, f"ok: {s.state}{lease}"


def readiness(s: AgentSnapshot) -> tuple[bool, str]:
    if s.state == "running" and s.round is not None and s.workers_running > 0:
        return True, (f"ready: {s.workers_running} workers running in round {s.round} "
                      f"(world size {s.world_size}, group rank {s.group_rank})")
    where = f" (round {s.round})" if s.round is not None else ""
    return False, f"not ready: {s.state}{where}, {s.workers_running} workers running"


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "elastic-run"
    snapshot: Callable[[], AgentSnapshot]
    registry = None

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics" and self.registry is not None:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            self._answer(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/livez", "/readyz"):
            ok, text = (readiness if path == "/readyz" else liveness)(type(self).snapshot())
            self._answer(200 if ok else 503, (text + "\n").encode())
        else:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _not_allowed(self) -> None:
        self._answer(405, b"method not allowed: GET or HEAD\n", allow="GET, HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

    def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8", allow: str = "") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 -- a probe every few seconds is no news
        pass


class ProbeServer:
    """The endpoint, bound to ``host:port`` (port 0: a free one; ``port`` says which)."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], AgentSnapshot], registry=None) -> None:
        handler = type("Handler", (_Handler,), {"snapshot": staticmethod(snapshot), "registry": registry})
        server = http.server.ThreadingHTTPServer
        if ":" in host:  # an IPv6 address
            server = type("Server6", (server,), {"address_family": socket.AF_INET6})
        self._server = server((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
