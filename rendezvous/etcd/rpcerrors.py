"""gRPC failures mapped to the ``rendezvous.errors`` tree: the one boundary where an ``grpc.RpcError``
becomes an error of ours (callers never see gRPC's or etcd3's exceptions)."""

from __future__ import annotations

import grpc

from rendezvous.errors import (
    LeaseNotFoundError,
    RendezvousConnectionError,
    RendezvousCredentialsError,
    RendezvousError,
    RendezvousNoSpaceError,
)

from . import retry
from .endpoints import Endpoint

__all__ = ["Unreachable", "map_rpc_error", "details_of", "NOSPACE_FIX", "no_space"]

# What an operator does about etcd's NOSPACE alarm (README "Running etcd"): deleting keys frees nothing.
NOSPACE_FIX = (
    "compact its history (etcdctl compact <current revision>), defragment every member (etcdctl defrag), "
    "then clear the alarm (etcdctl alarm disarm); run etcd with --auto-compaction-retention so it does not fill again"
)


def no_space(where: str) -> RendezvousNoSpaceError:
    return RendezvousNoSpaceError(
        f"{where} is out of space (NOSPACE alarm: mvcc: database space exceeded) and refuses every write: "
        + NOSPACE_FIX
    )


class Unreachable(RendezvousConnectionError):
    """No endpoint answered within a call's budget; ``failures`` says which were tried and why."""

    def __init__(self, failures: dict[str, str], attempts: int, spent: float, note: str = "") -> None:
        super().__init__(retry.unreachable_message(failures, attempts, spent) + (f" ({note})" if note else ""))
        self.failures, self.attempts, self.spent = failures, attempts, spent


def details_of(exc: grpc.RpcError) -> str:
    return (exc.details() or "") if hasattr(exc, "details") else ""


def _describe(exc: grpc.RpcError) -> str:
    details = details_of(exc)
    code = exc.code().name if hasattr(exc, "code") else "ERROR"
    return f"{code}: {details}" if details else code


def map_rpc_error(
    exc: grpc.RpcError, endpoint: Endpoint | None = None, access: tuple[str, str, str] | None = None
) -> RendezvousError:
    """Map a gRPC error to the rendezvous error tree. ``access``: (user, "read" or "write", key) of the
    call, to name what a permission denied was about."""
    code = exc.code()
    where = f"etcd at {endpoint}" if endpoint else "etcd"
    details = details_of(exc)
    if code.name in retry.RETRYABLE_CODES or retry.is_retryable(code.name, details):  # unreachable, or "try again"
        return RendezvousConnectionError(f"cannot reach {where}: {_describe(exc)}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and "authentication is not enabled" in details:
        return RendezvousCredentialsError(
            f"{where} does not use authentication, but a user was given (ELASTIC_ETCD_USER or --rdzv-conf user=): "
            "leave the user and password out, or enable authentication on etcd"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED and access is not None:
        return RendezvousCredentialsError(_denied(where, *access))
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return RendezvousCredentialsError(f"{where} refused the credentials: {details or code.name}")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in details:
        return RendezvousCredentialsError(f"{where} refused the credentials: it requires a user and password")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
        return RendezvousCredentialsError(f"{where} refused the credentials: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "database space exceeded" in details:
        return no_space(where)
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return LeaseNotFoundError(f"{where}: {details}")
    return RendezvousError(f"{where} failed: {_describe(exc)}")


def _denied(where: str, user: str, verb: str, key: str) -> str:
    """``etcd at h:2379 let user 'trainer' in, but its roles may not write '/elastic/job/state' ...``"""
    top = "/" + key.strip("/").split("/")[0] + "/" if key.startswith("/") else key
    return (
        f"{where} let user {user!r} in, but its roles may not {verb} {key!r} (permission denied): grant one of "
        f"them readwrite on the key prefix, e.g. etcdctl role grant-permission <role> --prefix=true readwrite {top}"
    )
