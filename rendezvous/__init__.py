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
from .etcd_server import EtcdCluster, EtcdServer

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
