"""A replica that does not lead hands its requests to the one that does: quorum requests are
forwarded (the client keeps its connection to this replica and never sees the hop), heartbeats are
relayed as one table per tick, never written to etcd.

A forwarded request carries ``FORWARDED`` in its metadata; a replica that receives one and does not
lead answers UNAVAILABLE, and the sender waits for the election to name the new leader.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping

import grpc

from . import wire

__all__ = ["FORWARDED", "Relay", "LeaderGone", "encode_ages", "decode_ages"]

FORWARDED = ("x-etcd-elastic-forwarded", "1")


class LeaderGone(Exception):
    """The leader did not answer (or is not the leader any more): ask the next one."""


def encode_ages(ages: Mapping[str, float]) -> bytes:
    return json.dumps({"ages": dict(ages)}).encode()


def decode_ages(raw: bytes) -> dict[str, float]:
    """The relayed table ``{replica_id: seconds since heard}``; ValueError if it is not one."""
    data = json.loads(raw)
    ages = data["ages"] if isinstance(data, dict) else None
    if not isinstance(ages, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) for k, v in ages.items()
    ):
        raise ValueError("not a heartbeat table")
    return {k: max(float(v), 0.0) for k, v in ages.items()}


class Relay:
    """gRPC channels to the leaders this replica has known (one per address)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = grpc.insecure_channel(address)
            return self._channels[address]

    def forward(self, address: str, request: bytes, timeout: float, changed: Callable[[], bool]) -> object:
        """The leader's answer (a Quorum) to ``request``; LeaderGone when it did not answer or the
        leadership ``changed()`` meanwhile; TimeoutError after ``timeout``."""
        call = self._channel(address).unary_unary(
            wire.QUORUM_METHOD,
            request_serializer=wire.identity,
            response_deserializer=wire.LighthouseQuorumResponse.FromString,
        )
        future = call.future(request, timeout=max(timeout, 0.001), metadata=(FORWARDED,))
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        while not done.is_set():
            if changed():
                future.cancel()
                raise LeaderGone(f"the leadership moved from {address}")
            done.wait(0.05)
        try:
            return future.result().quorum
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"the leader at {address} formed no quorum in time") from None
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                raise LeaderGone(f"{address}: {exc.details()}") from None
            raise
        except grpc.FutureCancelledError:
            raise LeaderGone(f"the call to {address} was cancelled") from None

    def send_heartbeats(self, address: str, ages: Mapping[str, float], timeout: float) -> bool:
        """Hand the table to the leader; False when it did not take it."""
        call = self._channel(address).unary_unary(
            wire.RELAY_METHOD, request_serializer=wire.identity, response_deserializer=wire.identity
        )
        try:
            call(encode_ages(ages), timeout=timeout, metadata=(FORWARDED,))
            return True
        except grpc.RpcError:
            return False

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
