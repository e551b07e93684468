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
)

from . import retry
from .channels import Channels
from .endpoints import Endpoint
from .rpcerrors import Unreachable, details_of, map_rpc_error
from .target import DEFAULT_TIMEOUT, EtcdTarget
from .txn import KeyValue, _b, prefix_range_end

__all__ = ["DEFAULT_TIMEOUT", "EtcdClient", "EtcdTarget"]


class EtcdClient:
    """A connection to an etcd v3 cluster through a list of endpoints.

    ``timeout`` bounds every call, failover included: a call that cannot be served by any endpoint
    within it raises RendezvousConnectionError naming the endpoints tried.
    """

    def __init__(
        self,
        endpoints: "str | Sequence[Endpoint] | EtcdTarget",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        """``EtcdClient(target)``, or the target's fields: ``EtcdClient("host:port", timeout=...)``."""
        if isinstance(endpoints, EtcdTarget):
            self.target = endpoints
        else:
            self.target = EtcdTarget.of(
                endpoints if isinstance(endpoints, str) else tuple(endpoints),
                timeout=timeout,
                ca_cert=ca_cert,
                cert_key=cert_key,
                cert_cert=cert_cert,
                user=user,
                password=password,
            )
        self.endpoints: tuple[Endpoint, ...] = self.target.endpoints
        self.timeout = self.target.timeout
        self._user, self._password = self.target.user, self.target.password
        self.channels = Channels(self.endpoints, self.target.files)
        self.observer: Callable[[str, float, str | None], None] | None = None  # each call, for metrics
        self._token: str | None = None
        self._last_call_by: float | None = None  # set by ``farewell``: no call goes on past it

    def farewell(self, seconds: float) -> None:
        """From now on, every call (from any thread) ends within ``seconds``: what a process says to
        etcd as it leaves shares one budget, so an etcd that lost its quorum costs one timeout, not
        one a call. A call made once the time is spent fails at once."""
        self._last_call_by = time.monotonic() + seconds

    # -- auth ------------------------------------------------------------------------------------
    def _metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...] | None:
        """The auth token, and for streams etcd's "require leader" flag: a member that loses its
        leader then ends the stream instead of serving it from a store that no longer moves."""
        metadata = (("token", self._token),) if self._token else ()
        if require_leader:
            metadata += (("hasleader", "true"),)
        return metadata or None

    def _authenticate(self, index: int, timeout: float) -> None:
        stub = self.channels.stub(index, "AuthStub")
        request = etcdrpc.AuthenticateRequest(name=self._user, password=self._password)
        self._token = stub.Authenticate(request, timeout=timeout).token

    def _call(self, service: str, method: str, request: Any, timeout: float | None = None, *, auth: bool = True) -> Any:
        """One unary call, retried across the endpoints until it succeeds or its budget is spent.

        The only place gRPC errors of calls are caught. What is retried, and for how long each
        try may take, is ``rendezvous.etcd.retry``'s to say.
        """
        budget = self.timeout if timeout is None else timeout
        started = time.monotonic()
        if self._last_call_by is not None:
            budget = min(budget, self._last_call_by - started)
        deadline = started + budget
        count = len(self.endpoints)
        failures: dict[str, str] = {}
        index = self.channels.current
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
                stub = self.channels.stub(index, service)
                try:
                    response = self._invoke(stub, method, request, share, auth)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAUTHENTICATED or self._user is None or not auth:
                        raise
                    # The auth token expired: get a new one and retry once on the same endpoint.
                    self._authenticate(index, max(deadline - time.monotonic(), 0.1))
                    response = self._invoke(stub, method, request, max(deadline - time.monotonic(), 0.1), auth)
            except grpc.RpcError as exc:
                code, details = exc.code(), details_of(exc)
                if retry.is_retryable(code.name, details):
                    failures[str(self.endpoints[index])] = retry.reason(code.name, details, share)
                    index = (index + 1) % count
                    continue
                raise map_rpc_error(exc, self.endpoints[index], _access(self._user, method, request)) from exc
            self.channels.current = index
            return response
        self.channels.current = index  # the next call starts where this one would have gone on
        if not failures:
            failures = {str(ep): "no time left to try" for ep in self.endpoints}
        raise Unreachable(failures, attempt, time.monotonic() - started)

    def wait_ready(
        self, key: str | bytes, timeout: float, report: Callable[[str], None] | None = None, every: float = 5.0
    ) -> None:
        """Block until etcd serves a linearizable read of ``key``, up to ``timeout`` seconds.

        ``report`` gets a line now and then while it waits (``waiting for etcd at h:p (connection
        refused), 52 s left``). Raises RendezvousConnectionError when the time is up.
        """
        started = time.monotonic()
        deadline = started + timeout
        next_report = started + min(1.0, every)  # then every ``every`` seconds, on that grid
        tries, failures = 0, {}
        while True:
            now = time.monotonic()
            # Short tries, ending by the next line's time; a connection being set up goes on between them.
            budget = max(min(deadline - now, next_report - now, 2.0), 0.05)
            try:
                self._call("KVStub", "Range", etcdrpc.RangeRequest(key=_b(key)), timeout=budget)
                return
            except RendezvousCredentialsError:
                raise  # a refused password does not get better by waiting
            except Unreachable as exc:
                tries, failures = tries + exc.attempts, {**failures, **exc.failures}
            except RendezvousConnectionError as exc:
                tries, failures = tries + 1, {**failures, ",".join(map(str, self.endpoints)): str(exc)}
            now = time.monotonic()
            if now >= deadline:
                raise Unreachable(failures, tries, now - started, f"connect_timeout is {timeout:g} s") from None
            if report is not None and now >= next_report:
                report(f"waiting for etcd at {retry.where(failures)}, {deadline - now:.0f} s left")
                while next_report <= now:
                    next_report += every
            time.sleep(min(0.2, max(min(deadline, next_report) - time.monotonic(), 0.0)))

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
        self.channels.close()

    def __enter__(self) -> "EtcdClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EtcdClient({','.join(map(str, self.endpoints))!r})"

    # -- key/value ---------------------------------------------------------------------------
    def range(self, request: Any) -> Any:
        """One RangeRequest as given (a revision, a limit, sorting); the raw RangeResponse."""
        return self._call("KVStub", "Range", request)

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
            index = self.channels.current
        channel = self.channels.stream_channel(index)
        return channel, self.endpoints[index], self._metadata(require_leader=True)

    def stream_failed(self, exc: BaseException, endpoint: Endpoint | None) -> None:
        """A stream opened on ``endpoint`` broke: forget an expired token, or move on from the endpoint."""
        if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            self._token = None
        elif endpoint is not None:
            self.channels.rotate(endpoint)

    def status(self) -> Any:
        return self._call("MaintenanceStub", "Status", etcdrpc.StatusRequest())


def _op_key(op: Any) -> bytes:
    """The key of a transaction's operation."""
    which = op.WhichOneof("request")
    return getattr(getattr(op, which), "key", b"") if which else b""


def _writes(request: Any) -> bool:
    return any(op.WhichOneof("request") in ("request_put", "request_delete_range") for op in request.success)


def _access(user: str | None, method: str, request: Any) -> tuple[str, str, str] | None:
    """(user, "read" or "write", key) of a key-value call, to name what a permission denied was about."""
    if user is None:
        return None
    if method in ("Range", "Put", "DeleteRange"):
        key = request.key
    elif method == "Txn":
        keys = [c.key for c in request.compare] + [_op_key(op) for op in request.success]
        key = next((k for k in keys if k), b"")
    else:
        return None
    verb = "read" if method == "Range" or (method == "Txn" and not _writes(request)) else "write"
    return user, verb, key.decode(errors="replace")
