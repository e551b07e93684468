"""The agent's HTTP endpoint (``--http-port``): ``/metrics`` for Prometheus, ``/healthz`` and
``/readyz`` for a kubelet's probes. Off unless a port is given; served from a thread of its own,
so a slow scrape never slows the agent's loop.

- ``/healthz`` (liveness) and ``/readyz`` (readiness), as ``launcher/telemetry/liveness.py`` judges them:
  200 ``ok: ...`` / ``ready: ...``, or 503 with the reason.
- ``/metrics``: prometheus-client's exposition of ``launcher.telemetry.metrics``.
Anything else is 404; a method other than GET or HEAD is 405. Answers are one line of plain text.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable

from .liveness import AgentSnapshot, liveness, readiness

__all__ = ["ProbeServer"]


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
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
