"""Everything that talks to etcd: the connection, the CAS backend, the rendezvous rounds.

Names are imported on first use, so that ``rendezvous.etcd.server`` (the local etcd of
--standalone) can start before gRPC is loaded.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DEFAULT_KEY_PREFIX": "job.keys",
    "EtcdRendezvousBackend": "job.backend",
    "Token": "job.backend",
    "EtcdClient": "etcd.client",
    "Endpoint": "etcd.endpoints",
    "parse_endpoints": "etcd.endpoints",
    "RendezvousClosedError": "errors",
    "RendezvousConnectionError": "errors",
    "RendezvousCredentialsError": "errors",
    "RendezvousNoSpaceError": "errors",
    "RendezvousError": "errors",
    "RendezvousSettingsError": "errors",
    "LeaseNotFoundError": "errors",
    "RendezvousStateError": "errors",
    "RendezvousTimeoutError": "errors",
    "EtcdCluster": "etcd.server",
    "EtcdServer": "etcd.server",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rendezvous' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
