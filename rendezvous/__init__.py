"""Everything that talks to etcd: the connection, the CAS backend, the rendezvous rounds."""

from .backend import DEFAULT_KEY_PREFIX, EtcdRendezvousBackend, Token
from .client import EtcdClient, Endpoint, parse_endpoints
from .errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousSettingsError,
    RendezvousStateError,
    RendezvousTimeoutError,
)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "EtcdClient",
    "EtcdCluster",
    "EtcdRendezvousBackend",
    "EtcdServer",
    "Endpoint",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousSettingsError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "Token",
    "parse_endpoints",
]


def __getattr__(name: str):
    # The local etcd server (urllib, ssl) is only needed by --standalone and tests: import on use.
    if name in ("EtcdCluster", "EtcdServer"):
        from . import etcd_server

        return getattr(etcd_server, name)
    raise AttributeError(f"module 'rendezvous' has no attribute {name!r}")
