"""torchft's ``LighthouseService`` over gRPC (Quorum, Heartbeat), answered by a ``Replica``, and the
relay method the replicas use among themselves. Requests are decoded and checked here: a bad one is
INVALID_ARGUMENT with one line, never a traceback."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from rendezvous.errors import RendezvousError

from . import wire
from .forming import Withdrawn
from .relay import FORWARDED, decode_ages
from .replica import NotLeader, Replica

__all__ = ["serve"]

log = logging.getLogger("elastic.lighthouse")

_NO_DEADLINE = 24 * 3600.0  # a call without a deadline waits this long at most


class _Service:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def quorum(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            request = wire.LighthouseQuorumRequest.FromString(raw)
        except DecodeError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a LighthouseQuorumRequest")
        if not request.HasField("requester") or not request.requester.replica_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing requester")
        remaining = context.time_remaining()
        deadline = time.monotonic() + (remaining if remaining is not None else _NO_DEADLINE)
        forwarded = FORWARDED in tuple(context.invocation_metadata() or ())
        gone = threading.Event()

        def ended() -> None:  # run by gRPC when the call ends, also when its caller went away
            gone.set()
            self.replica.withdraw(request.requester)

        if not context.add_callback(ended):
            context.abort(grpc.StatusCode.CANCELLED, "the call ended before it was read")
        try:
            quorum = self.replica.quorum(request.requester, raw, deadline, forwarded=forwarded, gone=gone)
        except Withdrawn as exc:
            context.abort(grpc.StatusCode.CANCELLED, str(exc))
        except NotLeader as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except TimeoutError as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except RendezvousError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd: {exc}")
        return wire.LighthouseQuorumResponse(quorum=quorum).SerializeToString()

    def heartbeat(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            request = wire.LighthouseHeartbeatRequest.FromString(raw)
        except DecodeError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a LighthouseHeartbeatRequest")
        self.replica.heartbeat(request.replica_id)
        return b""

    def relay(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            ages = decode_ages(raw)
        except (ValueError, UnicodeDecodeError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a heartbeat table")
        try:
            self.replica.relayed(ages)
        except NotLeader as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return b""


def serve(replica: Replica, bind: str, *, workers: int = 256) -> tuple[grpc.Server, int]:
    """Start serving on ``bind`` (host:port; port 0 picks one): the server and its port."""
    service = _Service(replica)
    handlers: dict[str, Any] = {
        "Quorum": grpc.unary_unary_rpc_method_handler(service.quorum, wire.identity, wire.identity),
        "Heartbeat": grpc.unary_unary_rpc_method_handler(service.heartbeat, wire.identity, wire.identity),
    }
    relay_service, relay_method = wire.RELAY_METHOD.strip("/").split("/")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lighthouse-rpc"))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("torchft.LighthouseService", handlers),
            grpc.method_handlers_generic_handler(
                relay_service,
                {relay_method: grpc.unary_unary_rpc_method_handler(service.relay, wire.identity, wire.identity)},
            ),
        )
    )
    port = server.add_insecure_port(bind)
    if not port:
        raise OSError(f"cannot listen on {bind}")
    server.start()
    return server, port
