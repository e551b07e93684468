"""Helpers of the integration tests: several rendezvous handlers at once, each with its own etcd
client, with bounded waits; an endpoint where no etcd answers."""

from __future__ import annotations

import socket
import threading

from rendezvous import EtcdClient
from rendezvous.rounds.handler import RendezvousHandler
from rendezvous.settings import RendezvousSettings

_HELD: list[socket.socket] = []


def dead_endpoint() -> str:
    """A loopback port bound here and never listened on: a connection to it is refused, and no other
    process can take it while this test process holds it (a port merely free when picked was once, in
    CI, taken by an etcd another test started during a 9 s wait)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    _HELD.append(held)
    return f"127.0.0.1:{held.getsockname()[1]}"


class Nodes:
    def __init__(self, endpoints: str, key_prefix: str, **settings):
        self.endpoints = endpoints
        self.settings = RendezvousSettings(run_id="job", key_prefix=key_prefix, **settings)
        self.handlers: list[RendezvousHandler] = []
        self.clients: list[EtcdClient] = []

    def add(
        self, name: str, local_world_size: int = 1, launched_at: float | None = None, **changes
    ) -> RendezvousHandler:
        """A node's handler (``launched_at``: when its agent was launched, wall clock; default now)."""
        client = EtcdClient(self.endpoints, timeout=5)
        settings = self.settings.with_(**changes) if changes else self.settings
        handler = RendezvousHandler(
            client,
            settings,
            local_addr="127.0.0.1",
            local_world_size=local_world_size,
            node_id=name,
            launched_at=launched_at,
        )
        self.clients.append(client)
        self.handlers.append(handler)
        return handler

    def rendezvous(self, handlers, timeout: float = 30.0):
        """next_rendezvous on each handler in its own thread; {node_id: info or exception}."""
        return self.each(handlers, lambda handler: handler.next_rendezvous(), timeout)

    @staticmethod
    def each(handlers, fn, timeout: float = 30.0):
        """``fn(handler)`` for each handler in its own thread; {node_id: result or exception}."""
        results = {}

        def run(handler):
            try:
                results[handler.node_id] = fn(handler)
            except Exception as exc:  # reported to the test as a value
                results[handler.node_id] = exc

        threads = [threading.Thread(target=run, args=(h,), daemon=True) for h in handlers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in threads), "a rendezvous did not finish in time"
        return results

    def close(self):
        for handler in self.handlers:
            handler.shutdown()
        for client in self.clients:
            client.close()
