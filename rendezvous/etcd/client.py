"""The etcd v3 connection: an endpoint list with failover, timeouts, TLS and user/password auth.

``EtcdClient`` speaks gRPC to etcd through the stubs that python3-etcd3 generates (``etcd3.etcdrpc``)
and exposes the handful of calls the rendezvous needs: range reads, transactions and leases. Every
gRPC failure of a call is mapped here to the ``rendezvous.errors`` tree. Long-lived streams
(``watch.Watch``, ``session.Session``) run on ``grpc.aio`` channels that ``open_stream`` hands
out on the process's stream loop; they reconnect by themselves and never raise to their users.

Failover: a call goes to the endpoint that answered last; when that one is unreachable, silent or
between leaders the call moves on to the next one in the list, round and round with a short
backoff (``rendezvous.etcd.retry``), until one answers or the call's time budget is spent. The
connection error then names every endpoint tried, why each failed, and the time really spent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio
from etcd3 import etcdrpc

from rendezvous.errors import (
    LeaseNotFoundError,
    RendezvousConnectionError,
    RendezvousCredentialsError,
    RendezvousError,
    RendezvousSettingsError,
)

from . import retry, streams
from .endpoints import Endpoint, parse_endpoints
from .txn import KeyValue, _b, prefix_range_end

__all__ = ["DEFAULT_TIMEOUT", "EtcdClient", "map_rpc_error"]

DEFAULT_TIMEOUT = 5.0

# gRPC retries a dead endpoint with exponential backoff up to two minutes by default; an etcd member
# that comes back after a short outage must be usable again within about a second.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0),
    # Notice a silently dead peer on long-lived watch streams (etcd allows pings every 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]

# Codes that mean "this endpoint cannot serve us now": try the next one.
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _read_file(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise RendezvousSettingsError(f"cannot read the etcd {what} {path!r}: {exc.strerror}") from exc


class EtcdClient:
    """A connection to an etcd v3 cluster through a list of endpoints.

    ``timeout`` bounds every call, failover included: a call that cannot be served by any endpoint
    within it raises RendezvousConnectionError naming the endpoints tried.
    """

    def __init__(
        self,
        endpoints: str | Sequence[Endpoint],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.endpoints: tuple[Endpoint, ...] = (
            parse_endpoints(endpoints) if isinstance(endpoints, str) else tuple(endpoints)
        )
        if not self.endpoints:
            raise RendezvousSettingsError("no etcd endpoint given")
        if not timeout or timeout <= 0:
            raise RendezvousSettingsError(f"etcd timeout must be a positive number of seconds, not {timeout!r}")
        if (user is None) != (password is None):
            raise RendezvousSettingsError("etcd user and password go together: give both or neither")
        if (cert_key is None) != (cert_cert is None):
            raise RendezvousSettingsError("etcd client certificate and key go together: give both or neither")
        self.timeout = float(timeout)
        self._user, self._password = user, password
        self._files = (ca_cert, cert_key, cert_cert)
        tls = ca_cert is not None or cert_cert is not None
        self._credentials = None
        if tls or any(ep.secure for ep in self.endpoints):
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(ca_cert, "CA certificate"),
                private_key=_read_file(cert_key, "client key"),
                certificate_chain=_read_file(cert_cert, "client certificate"),
            )
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel | None] = [None] * len(self.endpoints)
        self._stream_channels: list[Any] = [None] * len(self.endpoints)  # grpc.aio, on the stream loop
        self._stubs: dict[tuple[int, str], Any] = {}
        self._current = 0
        self._answered: dict[Endpoint, float] = {}  # endpoint -> when a lease renewal on it was last answered
        self.observer: Callable[[str, float, str | None], None] | None = None  # each call, for metrics
        self._token: str | None = None
        self._closed = False

    def config(self) -> dict[str, Any]:
        """What ``from_config`` needs to connect the same way (for a helper process; holds the password)."""
        ca_cert, cert_key, cert_cert = self._files
        return {
            "endpoints": ",".join(f"{'https' if ep.secure else 'http'}://{ep.target}" for ep in self.endpoints),
            "timeout": self.timeout,
            "ca_cert": ca_cert,
            "cert_key": cert_key,
            "cert_cert": cert_cert,
            "user": self._user,
            "password": self._password,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "EtcdClient":
        return cls(
            config["endpoints"],
            timeout=config["timeout"],
            ca_cert=config.get("ca_cert"),
            cert_key=config.get("cert_key"),
            cert_cert=config.get("cert_cert"),
            user=config.get("user"),
            password=config.get("password"),
        )

    # -- connection management -------------------------------------------------------------
    def _channel(self, index: int) -> grpc.Channel:
        return self._open(self._channels, index, grpc)

    def _open(self, channels: list[Any], index: int, flavour: Any) -> Any:
        """The channel of endpoint ``index`` in ``channels``, made by ``flavour`` (grpc or grpc.aio)."""
        with self._lock:
            if self._closed:
                raise RendezvousConnectionError("the etcd client is closed")
            channel = channels[index]
            if channel is None:
                target = self.endpoints[index].target
                if self._credentials is not None:
                    channel = flavour.secure_channel(target, self._credentials, options=_CHANNEL_OPTIONS)
                else:
                    channel = flavour.insecure_channel(target, options=_CHANNEL_OPTIONS)
                channels[index] = channel
            return channel

    def _stub(self, index: int, service: str) -> Any:
        """The stub of ``service`` on endpoint ``index`` (made once: a stub builds a callable per method)."""
        stub = self._stubs.get((index, service))
        if stub is None:
            stub = self._stubs[(index, service)] = getattr(etcdrpc, service)(self._channel(index))
        return stub

    def _metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...] | None:
        """The auth token, and for streams etcd's "require leader" flag: a member that loses its
        leader then ends the stream instead of serving it from a store that no longer moves."""
        metadata = (("token", self._token),) if self._token else ()
        if require_leader:
            metadata += (("hasleader", "true"),)
        return metadata or None

    def _authenticate(self, index: int, timeout: float) -> None:
        stub = self._stub(index, "AuthStub")
        request = etcdrpc.AuthenticateRequest(name=self._user, password=self._password)
        self._token = stub.Authenticate(request, timeout=timeout).token

    def _call(self, service: str, method: str, request: Any, timeout: float | None = None, *, auth: bool = True) -> Any:
        """One unary call, retried across the endpoints until it succeeds or its budget is spent.

        The only place gRPC errors of calls are caught. What is retried, and for how long each
        try may take, is ``rendezvous.etcd.retry``'s to say.
        """
        budget = self.timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + budget
        count = len(self.endpoints)
        failures: dict[str, str] = {}
        index = self._current
        attempt = 0
        while True:
            pause = retry.backoff(attempt, count)
            if pause:
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            share = retry.attempt_timeout(remaining, count, attempt)
            attempt += 1
            try:
                if auth and self._user is not None and self._token is None:
                    self._authenticate(index, share)
                stub = self._stub(index, service)
                try:
                    response = self._invoke(stub, method, request, share, auth)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAUTHENTICATED or self._user is None or not auth:
                        raise
                    # The auth token expired: get a new one and retry once on the same endpoint.
                    self._authenticate(index, max(deadline - time.monotonic(), 0.1))
                    response = self._invoke(stub, method, request, max(deadline - time.monotonic(), 0.1), auth)
            except grpc.RpcError as exc:
                code, details = exc.code(), _details(exc)
                if retry.is_retryable(code.name, details):
                    failures[str(self.endpoints[index])] = retry.reason(code.name, details, share)
                    index = (index + 1) % count
                    continue
                raise map_rpc_error(exc, self.endpoints[index]) from exc
            self._current = index
            return response
        self._current = index  # the next call starts where this one would have gone on
        if not failures:
            failures = {str(ep): "no time left to try" for ep in self.endpoints}
        raise _Unreachable(failures, attempt, time.monotonic() - started)

    def wait_ready(
        self, key: str | bytes, timeout: float, report: Callable[[str], None] | None = None, every: float = 5.0
    ) -> None:
        """Block until etcd serves a linearizable read of ``key``, up to ``timeout`` seconds.

        ``report`` gets a line now and then while it waits (``waiting for etcd at h:p (connection
        refused), 52 s left``). Raises RendezvousConnectionError when the time is up.
        """
        started = time.monotonic()
        deadline = started + timeout
        next_report = started + min(1.0, every)
        while True:
            remaining = deadline - time.monotonic()
            try:
                # Short tries, so that a line can be said early; a connection being set up goes on between them.
                self._call("KVStub", "Range", etcdrpc.RangeRequest(key=_b(key)), timeout=max(min(remaining, 2.0), 0.05))
                return
            except RendezvousCredentialsError:
                raise  # a refused password does not get better by waiting
            except RendezvousConnectionError as exc:
                now = time.monotonic()
                if now >= deadline:
                    raise RendezvousConnectionError(
                        f"{exc} (waited {now - started:.0f} s for etcd; connect_timeout is {timeout:g} s)"
                    ) from None
                if report is not None and now >= next_report:
                    where = exc.where if isinstance(exc, _Unreachable) else str(exc)
                    report(f"waiting for etcd at {where}, {deadline - now:.0f} s left")
                    next_report = now + every
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _invoke(self, stub: Any, method: str, request: Any, timeout: float, auth: bool = True) -> Any:
        """One try; ``observer(method, seconds, error kind or None)`` hears of it (metrics)."""
        started, error = time.monotonic(), None
        try:
            return getattr(stub, method)(request, timeout=timeout, metadata=self._metadata() if auth else None)
        except grpc.RpcError as exc:
            error = exc.code().name
            raise
        finally:
            if self.observer is not None:
                self.observer(method, time.monotonic() - started, error)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, [None] * len(self.endpoints)
            self._stubs = {}
            stream_channels, self._stream_channels = self._stream_channels, [None] * len(self.endpoints)
        for channel in channels:
            if channel is not None:
                channel.close()
        stream_channels = [c for c in stream_channels if c is not None]
        if stream_channels:
            try:
                streams.run(_close_stream_channels(stream_channels), timeout=2.0)
            except (TimeoutError, RuntimeError):
                pass  # the loop is gone (interpreter exit): the channels go with it

    def __enter__(self) -> "EtcdClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EtcdClient({','.join(map(str, self.endpoints))!r})"

    # -- key/value ---------------------------------------------------------------------------
    def get(self, key: str | bytes) -> KeyValue | None:
        response = self._call("KVStub", "Range", etcdrpc.RangeRequest(key=_b(key)))
        return KeyValue.from_proto(response.kvs[0]) if response.kvs else None

    def get_prefix(
        self, prefix: str | bytes, *, keys_only: bool = False, limit: int = 0, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """All keys under ``prefix`` in key order (the first ``limit``, if given; as of ``revision``, if
        given), and the store revision they were read at."""
        request = etcdrpc.RangeRequest(
            key=_b(prefix), range_end=prefix_range_end(prefix), keys_only=keys_only, limit=limit, revision=revision
        )
        response = self._call("KVStub", "Range", request)
        return [KeyValue.from_proto(kv) for kv in response.kvs], response.header.revision

    def count_prefix(self, prefix: str | bytes) -> int:
        request = etcdrpc.RangeRequest(key=_b(prefix), range_end=prefix_range_end(prefix), count_only=True)
        return int(self._call("KVStub", "Range", request).count)

    def put(self, key: str | bytes, value: bytes, lease: int = 0) -> int:
        """Write unconditionally; returns the new store revision."""
        response = self._call("KVStub", "Put", etcdrpc.PutRequest(key=_b(key), value=value, lease=lease))
        return response.header.revision

    def delete(self, key: str | bytes, *, prefix: bool = False) -> int:
        """Delete a key (or every key under a prefix); returns how many were deleted."""
        request = etcdrpc.DeleteRangeRequest(key=_b(key))
        if prefix:
            request.range_end = prefix_range_end(key)
        return int(self._call("KVStub", "DeleteRange", request).deleted)

    def txn(
        self,
        compare: Iterable[Any],
        success: Iterable[Any] = (),
        failure: Iterable[Any] = (),
        timeout: float | None = None,
    ) -> Any:
        """One etcd transaction; returns the raw TxnResponse (``succeeded``, ``responses``, ``header``)."""
        request = etcdrpc.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        return self._call("KVStub", "Txn", request, timeout=timeout)

    # -- leases --------------------------------------------------------------------------------
    def grant_lease(self, ttl: int) -> int:
        response = self._call("LeaseStub", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=int(ttl)))
        if response.error:
            raise RendezvousError(f"etcd refused a lease of {ttl}s: {response.error}")
        return int(response.ID)

    def revoke_lease(self, lease_id: int, timeout: float | None = None) -> bool:
        """Revoke a lease (its keys are deleted at once); False when it had already expired."""
        try:
            self._call("LeaseStub", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout=timeout)
        except LeaseNotFoundError:
            return False
        return True

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds; -1 when it does not exist (any more)."""
        response = self._call("LeaseStub", "LeaseTimeToLive", etcdrpc.LeaseTimeToLiveRequest(ID=lease_id))
        return int(response.TTL)

    # -- streams (watches, keep-alives) and maintenance -------------------------------------------
    def ensure_token(self) -> None:
        """Authenticate now if this client uses auth and holds no token (a blocking call)."""
        if self._user is not None and self._token is None:
            request = etcdrpc.AuthenticateRequest(name=self._user, password=self._password)
            self._token = self._call("AuthStub", "Authenticate", request, auth=False).token

    async def open_stream(self, index: int | None = None) -> tuple[Any, Endpoint, tuple[tuple[str, str], ...] | None]:
        """The grpc.aio channel, endpoint and auth metadata a stream should use now (or on endpoint ``index``).

        Only for coroutines on the stream loop (``rendezvous.etcd.streams``): aio channels belong to it.
        A missing auth token is fetched by a blocking call in a worker thread, off the loop.
        """
        if self._user is not None and self._token is None:
            await asyncio.to_thread(self.ensure_token)
        if index is None:
            index = self._current
        channel = self._open(self._stream_channels, index, grpc.aio)
        return channel, self.endpoints[index], self._metadata(require_leader=True)

    def stream_failed(self, exc: BaseException, endpoint: Endpoint | None) -> None:
        """A stream opened on ``endpoint`` broke: forget an expired token, or move on from the endpoint."""
        if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            self._token = None
        elif endpoint is not None:
            self.rotate(endpoint)

    def answered(self, endpoint: Endpoint) -> None:
        """A lease renewal sent on ``endpoint`` was answered: the member and the link to it are alive."""
        self._answered[endpoint] = time.monotonic()

    def last_answer(self, endpoint: Endpoint | None) -> float:
        """When ``endpoint`` last answered a lease renewal (monotonic; 0: never)."""
        return self._answered.get(endpoint, 0.0)

    def prefer(self, endpoint: Endpoint) -> None:
        """``endpoint`` answered when another did not: the next call starts there."""
        self._current = self.endpoints.index(endpoint)

    def rotate(self, failed: Endpoint) -> None:
        """Move on from an endpoint a stream found dead, so the next call starts elsewhere."""
        if self.endpoints[self._current] == failed:
            self._current = (self._current + 1) % len(self.endpoints)

    def status(self) -> Any:
        return self._call("MaintenanceStub", "Status", etcdrpc.StatusRequest())


async def _close_stream_channels(channels: list[Any]) -> None:
    for channel in channels:
        await channel.close()


class _Unreachable(RendezvousConnectionError):
    """No endpoint answered within a call's budget; ``where`` says which were tried and why."""

    def __init__(self, failures: dict[str, str], attempts: int, spent: float) -> None:
        super().__init__(retry.unreachable_message(failures, attempts, spent))
        self.where = retry.where(failures)


def _details(exc: grpc.RpcError) -> str:
    return (exc.details() or "") if hasattr(exc, "details") else ""


def _describe(exc: grpc.RpcError) -> str:
    details = _details(exc)
    code = exc.code().name if hasattr(exc, "code") else "ERROR"
    return f"{code}: {details}" if details else code


def map_rpc_error(exc: grpc.RpcError, endpoint: Endpoint | None = None) -> RendezvousError:
    """Map a gRPC error to the rendezvous error tree."""
    code = exc.code()
    where = f"etcd at {endpoint}" if endpoint else "etcd"
    details = _details(exc)
    if code in _UNREACHABLE:
        return RendezvousConnectionError(f"cannot reach {where}: {_describe(exc)}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return RendezvousCredentialsError(f"{where} refused the credentials: {details or code.name}")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in details:
        return RendezvousCredentialsError(f"{where} refused the credentials: it requires a user and password")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
        return RendezvousCredentialsError(f"{where} refused the credentials: {details}")
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return LeaseNotFoundError(f"{where}: {details}")
    return RendezvousError(f"{where} failed: {_describe(exc)}")
