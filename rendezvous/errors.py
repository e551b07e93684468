"""The errors raised by the rendezvous package.

Every etcd or gRPC failure is mapped to this tree at the boundary (``client.py``), so callers
never see a ``grpc.RpcError`` or an ``etcd3`` exception::

    RendezvousError
    ├── RendezvousConnectionError   etcd could not be reached (or answered too late)
    │   └── RendezvousCredentialsError  etcd refused the user, password or certificate
    ├── RendezvousNoSpaceError      etcd is out of space (its NOSPACE alarm): nothing can be written
    ├── RendezvousStateError        a value read from etcd is not what we wrote
    ├── LeaseNotFoundError          etcd has no such lease (it expired or was revoked)
    ├── RendezvousClosedError       the job was closed; a new run id starts fresh
    ├── RendezvousTimeoutError      a bounded wait ran out (join, last call, store get)
    └── RendezvousSettingsError     a setting or an endpoint string is invalid

The names match torch.distributed.elastic's, so code written against either reads the same.
"""

from __future__ import annotations

__all__ = [
    "RendezvousError",
    "RendezvousConnectionError",
    "RendezvousCredentialsError",
    "RendezvousNoSpaceError",
    "RendezvousStateError",
    "LeaseNotFoundError",
    "RendezvousClosedError",
    "RendezvousTimeoutError",
    "RendezvousSettingsError",
]


class RendezvousError(Exception):
    """Base of every error this package raises."""


class RendezvousConnectionError(RendezvousError):
    """Raised when no etcd endpoint answered within the configured timeout."""


class RendezvousCredentialsError(RendezvousConnectionError):
    """Raised when etcd refuses the credentials: waiting will not help."""


class RendezvousNoSpaceError(RendezvousError):
    """Raised when etcd refuses a write because its database reached its quota (the NOSPACE alarm).

    Reads still work; writes fail until an operator compacts, defragments and disarms the alarm.
    """


class RendezvousStateError(RendezvousError):
    """Raised when a value stored in etcd is malformed or of an unknown schema version."""


class RendezvousClosedError(RendezvousError):
    """Raised when joining or using a rendezvous that has been closed. ``while_waiting``: it closed
    while this node waited for a round of it, rather than before this node came."""

    while_waiting: bool = False


class RendezvousTimeoutError(RendezvousError):
    """Raised when a bounded wait (join, last call, store get) runs out."""


class RendezvousSettingsError(RendezvousError, ValueError):
    """Raised when a setting, an endpoint string or a --rdzv-conf entry is invalid."""


class LeaseNotFoundError(RendezvousError):
    """etcd has no such lease: it expired or was revoked, so keys cannot be written on it."""
