"""An in-memory backend with the same contract as EtcdRendezvousBackend, for tests without etcd."""

from __future__ import annotations

import threading
from typing import Any


class InMemoryBackend:
    """Keeps one state and a revision counter, as etcd would, behind a lock."""

    name = "in-memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._revision = 1
        self._state: tuple[bytes, int] | None = None

    def get_state(self) -> tuple[bytes, int] | None:
        with self._lock:
            return self._state

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, int, bool] | None:
        if not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"state must be bytes, not {type(state).__name__}")
        valid = token is None or (isinstance(token, int) and not isinstance(token, bool) and token > 0)
        with self._lock:
            current_token = self._state[1] if self._state else None
            if valid and token == current_token:
                self._revision += 1
                self._state = (bytes(state), self._revision)
                return bytes(state), self._revision, True
            return None if self._state is None else (*self._state, False)

    def delete_state(self) -> bool:
        with self._lock:
            existed, self._state = self._state is not None, None
            return existed
