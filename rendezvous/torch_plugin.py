"""torch interop: a ``torch.distributed.Store`` on etcd v3, and the ``etcd-v3`` torchrun handler.

This module imports torch; nothing else in the package imports it. torchrun finds the handler
through the entry point ``etcd-v3`` in group ``torchrun.handlers`` (see pyproject.toml):

    torchrun --rdzv-backend etcd-v3 --rdzv-endpoint HOST:PORT --rdzv-id ID ...

That uses torch's own DynamicRendezvousHandler over ``EtcdRendezvousBackend`` and the store below.
Note that torch's handler pickles its own state into the backend (and unpickles it on read): that
is torch's handler, not etcd-elastic's rounds, which keep JSON only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from .backend import EtcdRendezvousBackend
from .client import EtcdClient
from .errors import RendezvousTimeoutError
from .kvstore import EtcdKVStore
from .settings import CONF_KEYS, RendezvousSettings

__all__ = ["EtcdStore", "create_handler", "handler_creator"]


class EtcdStore(dist.Store):
    """c10d's Store API over ``EtcdKVStore``: usable with ``init_process_group(store=...)``."""

    def __init__(self, client: EtcdClient, run_id: str, *, key_prefix: str = "/elastic",
                 timeout: timedelta = timedelta(seconds=300)) -> None:
        super().__init__()
        self._kv = EtcdKVStore(client, run_id, key_prefix=key_prefix)
        self.set_timeout(timeout)

    def _seconds(self, override: timedelta | None = None) -> float:
        return (override if override is not None else self.timeout).total_seconds()

    def set(self, key: str, value: bytes | str) -> None:
        self._kv.set(key, value)

    def get(self, key: str) -> bytes:
        try:
            return self._kv.get(key, self._seconds())
        except RendezvousTimeoutError as exc:
            raise dist.DistStoreError(str(exc)) from None

    def add(self, key: str, value: int) -> int:
        return self._kv.add(key, value)

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        return self._kv.compare_set(key, expected_value, desired_value)

    def append(self, key: str, value: bytes | str) -> None:
        self._kv.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        try:
            return self._kv.multi_get(keys, self._seconds())
        except RendezvousTimeoutError as exc:
            raise dist.DistStoreError(str(exc)) from None

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._kv.multi_set(keys, values)

    def has_extended_api(self) -> bool:
        return True

    def wait(self, keys: list[str], override_timeout: timedelta | None = None) -> None:
        try:
            self._kv.wait(keys, self._seconds(override_timeout))
        except RendezvousTimeoutError as exc:
            raise dist.DistStoreError(str(exc)) from None

    def check(self, keys: list[str]) -> bool:
        return self._kv.check(keys)

    def delete_key(self, key: str) -> bool:
        return self._kv.delete_key(key)

    def num_keys(self) -> int:
        return self._kv.num_keys()


def create_handler(params: Any) -> Any:
    """torchrun's handler creator: torch's DynamicRendezvousHandler over our backend and store.

    ``--rdzv-conf`` keys of etcd-elastic (read_timeout, key_prefix, protocol, cacert, cert, key,
    user, password) configure the etcd connection; torch's own keys (join_timeout,
    last_call_timeout, close_timeout, heartbeat, keep_alive_*) go to torch's handler.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler as torch_create_handler

    ours = {k: str(v) for k, v in params.config.items() if k in CONF_KEYS and k not in ("join_timeout", "last_call_timeout", "close_timeout")}
    settings = RendezvousSettings.from_conf(params.run_id, params.min_nodes, params.max_nodes, ours)
    client = settings.connect(params.endpoint)
    backend = EtcdRendezvousBackend(client, params.run_id, settings.key_prefix)
    store = EtcdStore(client, params.run_id, key_prefix=settings.key_prefix)
    return torch_create_handler(store, backend, params)


def handler_creator() -> Callable[[Any], Any]:
    """The entry point torchrun loads: it calls this and registers what it returns."""
    return create_handler
