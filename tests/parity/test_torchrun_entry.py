"""Installing the package costs a torchrun that does not use it nothing: torch loads every
``torchrun.handlers`` entry point when its rendezvous registry is imported, and this package's
(``rendezvous.torchrun.entry``) imports neither gRPC nor the handler until ``etcd-v3`` is asked for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import handler_registry

PROBE = """
import json, sys
from torch.distributed.elastic.rendezvous import registry
print(json.dumps({name: name in sys.modules for name in ("grpc", "etcd3", "rendezvous.torchrun.plugin")}))
"""


def test_torchs_registry_loads_the_entry_point_without_grpc_or_the_handler():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "grpc": False,
        "etcd3": False,
        "rendezvous.torchrun.plugin": False,
    }


def test_asking_for_etcd_v3_gives_the_etcd_handler(etcd_endpoints):
    params = RendezvousParameters("etcd-v3", etcd_endpoints, "entry-test", 1, 1, join_timeout="5")
    handler = handler_registry.create_handler(params)
    try:
        assert handler.get_backend() == "etcd-v3"
    finally:
        handler.shutdown()


def test_an_empty_endpoint_is_etcds_default_port_and_a_bad_one_is_torchs_value_error():
    """As torch's etcd backends: "" is localhost:2379 (nothing answers there in the tests: torch's
    connection error names it); a malformed endpoint is a ValueError, not the project's own
    RendezvousSettingsError."""
    import socket

    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    from rendezvous.errors import RendezvousSettingsError
    from rendezvous.torchrun.plugin import create_handler

    with socket.socket() as probe:
        if probe.connect_ex(("localhost", 2379)) == 0:
            pytest.skip("something serves localhost:2379 on this machine")
    handler = create_handler(RendezvousParameters("etcd-v3", "", "entry-test", 1, 1, read_timeout="1"))
    with pytest.raises(RendezvousConnectionError, match="localhost:2379"):
        handler.next_rendezvous()
    with pytest.raises(ValueError) as raised:
        create_handler(RendezvousParameters("etcd-v3", "host:port:what", "entry-test", 1, 1))
    assert not isinstance(raised.value, RendezvousSettingsError) and "host:port:what" in str(raised.value)
