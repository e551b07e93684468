"""No Docker engine runs here, so the compose file is checked by reading it."""

from pathlib import Path
from urllib.parse import urlparse

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _parse_initial_cluster(text):
    pairs = [item.split("=", 1) for item in text.split(",")]
    return {name: url for name, url in pairs}


def test_compose_has_three_etcd_members_on_one_private_network():
    services = _services()
    assert sorted(services) == ["etcd-1", "etcd-2", "etcd-3"]
    for service in services.values():
        assert service["networks"] == ["etcd"]
        assert "healthcheck" in service and "endpoint" in service["healthcheck"]["test"]


def test_members_agree_on_initial_cluster_names_and_urls():
    services = _services()
    clusters = {name: s["environment"]["ETCD_INITIAL_CLUSTER"] for name, s in services.items()}
    assert len(set(clusters.values())) == 1, "every member must be given the same initial cluster"
    initial = _parse_initial_cluster(next(iter(clusters.values())))
    assert sorted(initial) == sorted(services)
    for name, service in services.items():
        env = service["environment"]
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == initial[name]
        assert urlparse(initial[name]).hostname == service["hostname"] == name
        listen_port = urlparse(env["ETCD_LISTEN_PEER_URLS"]).port
        assert urlparse(initial[name]).port == listen_port
        assert urlparse(env["ETCD_ADVERTISE_CLIENT_URLS"]).port == urlparse(env["ETCD_LISTEN_CLIENT_URLS"]).port


def test_each_member_publishes_its_client_port_on_a_distinct_host_port():
    published = []
    for service in _services().values():
        (mapping,) = service["ports"]
        host_port, container_port = mapping.split(":")
        assert container_port == "2379"
        published.append(host_port)
    assert len(set(published)) == 3


def test_every_etcd_the_project_starts_or_describes_compacts_and_has_a_quota():
    """docker-compose.yml, the Kubernetes example and the bundled etcd (--standalone, the tests)."""
    from rendezvous.etcd.server import HEALTH_ARGS

    for service in _services().values():
        env = service["environment"]
        assert env["ETCD_AUTO_COMPACTION_MODE"] == "periodic" and env["ETCD_AUTO_COMPACTION_RETENTION"] == "5m"
        assert int(env["ETCD_QUOTA_BACKEND_BYTES"]) == 2 * 1024**3
    manifest = (COMPOSE.parent / "examples" / "kubernetes" / "etcd.yaml").read_text()
    statefulset = next(d for d in yaml.safe_load_all(manifest) if d and d.get("kind") == "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ETCD_AUTO_COMPACTION_MODE"] == "periodic" and env["ETCD_AUTO_COMPACTION_RETENTION"] == "5m"
    assert int(env["ETCD_QUOTA_BACKEND_BYTES"]) == 2 * 1024**3
    assert set(HEALTH_ARGS) == {
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=5m",
        "--quota-backend-bytes=2147483648",
    }
