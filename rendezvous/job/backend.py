"""EtcdRendezvousBackend: a job's state in etcd, written only by compare-and-swap.

The backend knows bytes and a token, nothing else (the handler decides what the bytes mean). The
token is the etcd ``mod_revision`` of the state key as last seen. Every write is one etcd
transaction: ``If(revision compare) Then(Put) Else(Get)``, so a lost race costs one round trip.

The stored value is framed as ``rendezvous.job.keys`` says (a value that is not ours is refused with
RendezvousStateError instead of being handed to the handler). Nothing read from etcd is ever unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rendezvous.errors import RendezvousStateError  # noqa: F401 (documented raise)
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import swap
from rendezvous.etcd.txn import KeyValue

from .keys import DEFAULT_KEY_PREFIX, frame_state, job_key, unwrap_state, validate_run_id

__all__ = ["EtcdRendezvousBackend", "Token"]

Token = int
"""An etcd mod_revision: positive, and different after every write."""


class EtcdRendezvousBackend:
    """A rendezvous backend (torch's ``RendezvousBackend`` contract) on etcd v3."""

    def __init__(self, client: EtcdClient, run_id: str, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self._client = client
        self._run_id = validate_run_id(run_id)
        self._key = job_key(key_prefix, run_id, "state")

    @property
    def name(self) -> str:
        """The name torch's registry and logs show for this backend."""
        return "etcd-v3"

    @property
    def key(self) -> str:
        """The etcd key the state is stored under."""
        return self._key

    @property
    def client(self) -> EtcdClient:
        return self._client

    def get_state(self) -> tuple[bytes, Token] | None:
        """The stored state and its token, or None when there is no state.

        Raises:
            RendezvousConnectionError: etcd could not be reached within the client's timeout.
            RendezvousStateError: the stored value is not a state this backend wrote.
        """
        return self._decode(self._client.get(self._key))

    def set_state(
        self, state: bytes, token: Token | None = None, *, lease: int = 0, also: Sequence[Any] = ()
    ) -> tuple[bytes, Token, bool] | None:
        """Write ``state`` if nobody wrote since ``token``; returns ``(state, token, written)``.

        - no state yet and ``token`` is None: written; returns the new token;
        - ``token`` is the current one: written; the new token differs from the old;
        - ``token`` is old, None while a state exists, or not a valid token: not written; returns
          the current state and its token (None when there is no state at all).

        Each call is a single etcd transaction. ``lease`` (not torch's): the lease the key lives on
        (0: none, the key stays until deleted); LeaseNotFoundError when that lease is gone. ``also``
        (not torch's): etcd operations done in the same transaction when the state is written.

        Raises:
            RendezvousConnectionError: etcd could not be reached within the client's timeout.
            RendezvousStateError: the stored value (returned on a lost race) is not ours.
        """
        if not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"state must be bytes, not {type(state).__name__}")
        swapped = swap(self._client, self._key, frame_state(state), token, lease=lease, also=also)
        if swapped.written:
            return bytes(state), swapped.revision, True
        current = self._decode(swapped.current)
        return None if current is None else (current[0], current[1], False)

    def delete_state(self) -> bool:
        """Remove the stored state; True when there was one."""
        return self._client.delete(self._key) > 0

    def decode(self, kv: KeyValue | None) -> tuple[bytes, Token] | None:
        """A stored value as ``get_state`` returns it (for a caller that read the key itself)."""
        return self._decode(kv)

    def _decode(self, kv: KeyValue | None) -> tuple[bytes, Token] | None:
        if kv is None:
            return None
        return unwrap_state(self._key, kv.value), kv.mod_revision
