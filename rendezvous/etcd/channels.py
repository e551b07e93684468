"""The gRPC channels to an etcd cluster's endpoints, and which endpoint a call tries first.

One blocking channel per endpoint for unary calls, one ``grpc.aio`` channel per endpoint for the
streams (made on the stream loop), opened on first use with TLS when asked for. The pool remembers
which endpoint answered last (a call starts there), and when each last answered a lease renewal (a
watch on that member is then known to be alive without asking it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
from etcd3 import etcdrpc

from rendezvous.errors import RendezvousConnectionError, RendezvousSettingsError

from . import streams
from .endpoints import Endpoint

__all__ = ["Channels", "CHANNEL_OPTIONS"]

# gRPC retries a dead endpoint with exponential backoff up to two minutes by default; an etcd member
# that comes back after a short outage must be usable again within about a second.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0),
    # Notice a silently dead peer on long-lived watch streams (etcd allows pings every 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def _read_file(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise RendezvousSettingsError(f"cannot read the etcd {what} {path!r}: {exc.strerror}") from exc


class Channels:
    """The channels and stubs of every endpoint, and the endpoint to try first."""

    def __init__(self, endpoints: Sequence[Endpoint], tls_files: tuple[str | None, str | None, str | None]) -> None:
        """``tls_files``: the CA certificate, the client key and the client certificate (each may be None)."""
        self.endpoints = tuple(endpoints)
        ca_cert, cert_key, cert_cert = tls_files
        self._credentials = None
        if ca_cert is not None or cert_cert is not None or any(ep.secure for ep in self.endpoints):
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(ca_cert, "CA certificate"),
                private_key=_read_file(cert_key, "client key"),
                certificate_chain=_read_file(cert_cert, "client certificate"),
            )
        self._lock = threading.Lock()
        self._blocking: list[grpc.Channel | None] = [None] * len(self.endpoints)
        self._streaming: list[Any] = [None] * len(self.endpoints)  # grpc.aio, on the stream loop
        self._stubs: dict[tuple[int, str], Any] = {}
        self.current = 0  # the endpoint a call tries first: the one that answered last
        self._answered: dict[Endpoint, float] = {}  # endpoint -> when a lease renewal on it was last answered
        self.renew_every = 0.0  # seconds between the renewals of a lease on this client (0: none renewed)
        self._closed = False

    def stub(self, index: int, service: str) -> Any:
        """The stub of ``service`` on endpoint ``index`` (made once: a stub builds a callable per method)."""
        stub = self._stubs.get((index, service))
        if stub is None:
            stub = self._stubs[(index, service)] = getattr(etcdrpc, service)(self._open(self._blocking, index, grpc))
        return stub

    def stream_channel(self, index: int) -> Any:
        """The grpc.aio channel of endpoint ``index`` (only from the stream loop, which owns it)."""
        return self._open(self._streaming, index, grpc.aio)

    def _open(self, channels: list[Any], index: int, flavour: Any) -> Any:
        """The channel of endpoint ``index`` in ``channels``, made by ``flavour`` (grpc or grpc.aio)."""
        with self._lock:
            if self._closed:
                raise RendezvousConnectionError("the etcd client is closed")
            channel = channels[index]
            if channel is None:
                target = self.endpoints[index].target
                if self._credentials is not None:
                    channel = flavour.secure_channel(target, self._credentials, options=CHANNEL_OPTIONS)
                else:
                    channel = flavour.insecure_channel(target, options=CHANNEL_OPTIONS)
                channels[index] = channel
            return channel

    # -- which endpoint ----------------------------------------------------------------------------
    def renewing(self, interval: float) -> None:
        """A lease on this client is renewed every ``interval`` seconds (the shortest counts)."""
        self.renew_every = min(self.renew_every, interval) if self.renew_every else interval

    def answered(self, endpoint: Endpoint) -> None:
        """A lease renewal sent on ``endpoint`` was answered: the member and the link to it are alive."""
        self._answered[endpoint] = time.monotonic()

    def last_answer(self, endpoint: Endpoint | None) -> float:
        """When ``endpoint`` last answered a lease renewal (monotonic; 0: never)."""
        return self._answered.get(endpoint, 0.0)

    def prefer(self, endpoint: Endpoint) -> None:
        """``endpoint`` answered when another did not: the next call starts there."""
        self.current = self.endpoints.index(endpoint)

    def rotate(self, failed: Endpoint) -> None:
        """Move on from an endpoint a stream found dead, so the next call starts elsewhere."""
        if self.endpoints[self.current] == failed:
            self.current = (self.current + 1) % len(self.endpoints)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            blocking, self._blocking = self._blocking, [None] * len(self.endpoints)
            self._stubs = {}
            streaming, self._streaming = self._streaming, [None] * len(self.endpoints)
        for channel in blocking:
            if channel is not None:
                channel.close()
        streaming = [c for c in streaming if c is not None]
        if streaming:
            try:
                streams.run(_close_all(streaming), timeout=2.0)
            except (TimeoutError, RuntimeError):
                pass  # the loop is gone (interpreter exit): the channels go with it


async def _close_all(channels: list[Any]) -> None:
    for channel in channels:
        await channel.close()
