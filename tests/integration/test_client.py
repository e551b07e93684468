"""The etcd connection against real etcd processes: timeouts, failover, auth, TLS, watches."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest
from etcd3 import etcdrpc

from rendezvous import (
    EtcdClient,
    EtcdCluster,
    EtcdRendezvousBackend,
    EtcdServer,
    RendezvousConnectionError,
)
from rendezvous.etcd.server import ServerTLS
from rendezvous.etcd.session import Session
from rendezvous.etcd.watch import EventType, Watch
from tests.integration.rdzv_helpers import dead_endpoint


def test_unreachable_etcd_is_retried_for_the_whole_timeout_and_the_error_says_how_long():
    endpoint = dead_endpoint()
    client = EtcdClient(endpoint, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError) as info:
        EtcdRendezvousBackend(client, "job").get_state()
    spent = time.monotonic() - started
    assert 0.9 <= spent < 1.3, f"gave up after {spent:.2f}s"
    message = str(info.value)
    assert f"cannot reach etcd at {endpoint} (connection refused)" in message
    tries = int(message.split("tried ")[1].split(" times")[0])
    print(f"{tries} tries in {spent:.2f}s")
    assert tries >= 4 and "over 1.0 s" in message


def test_waiting_for_etcd_says_so_every_5_s_and_the_last_lines_figures_add_up():
    said: list[tuple[float, str]] = []
    client = EtcdClient(dead_endpoint(), timeout=1)
    started = time.monotonic()
    try:
        with pytest.raises(RendezvousConnectionError) as info:
            client.wait_ready("/k", 9, report=lambda line: said.append((time.monotonic() - started, line)))
    finally:
        client.close()
    spent = time.monotonic() - started
    # a line after 1 s, then one every 5 s: tries end by the next line's time
    assert [round(at) for at, _ in said] == [1, 6] and 4.8 <= said[1][0] - said[0][0] <= 5.3, said
    assert said[0][1].startswith("waiting for etcd at 127.0.0.1:") and said[0][1].endswith(
        "(connection refused), 8 s left"
    )
    # the last line counts every try of the whole wait, over the whole wait
    message = str(info.value)
    tries = int(re.search(r"tried (\d+) times over ([\d.]+) s", message).group(1))
    over = float(re.search(r"tried \d+ times over ([\d.]+) s", message).group(1))
    assert tries >= 20 and abs(over - spent) < 0.3 and message.endswith("(connect_timeout is 9 s)"), message
    print(f"\n{said}\n{message}")


def test_black_holed_etcd_raises_connection_error_within_the_timeout():
    # A listening socket that never speaks gRPC: the call can only end by its deadline.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        client = EtcdClient(f"127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
        started = time.monotonic()
        with pytest.raises(RendezvousConnectionError):
            client.get("k")
        assert time.monotonic() - started < 1.5


def test_connection_error_names_every_endpoint_tried():
    dead = [dead_endpoint(), dead_endpoint()]
    with pytest.raises(RendezvousConnectionError) as info:
        EtcdClient(",".join(dead), timeout=1.0).get("k")
    for endpoint in dead:
        assert endpoint in str(info.value)


def test_client_fails_over_when_the_first_endpoint_is_dead(etcd_endpoints, key_prefix):
    client = EtcdClient(f"{dead_endpoint()},{etcd_endpoints}", timeout=3.0)
    try:
        backend = EtcdRendezvousBackend(client, "job", key_prefix=key_prefix)
        _, token, written = backend.set_state(b"x")
        assert written and backend.get_state() == (b"x", token)
        backend.delete_state()
    finally:
        client.close()


def test_client_fails_over_when_a_cluster_member_stops():
    with EtcdCluster(3) as cluster:
        client = EtcdClient(cluster.endpoints, timeout=3.0)
        backend = EtcdRendezvousBackend(client, "job")
        _, token, _ = backend.set_state(b"1")
        # The client starts on the first endpoint; stop that member and the next call moves on.
        cluster.stop_member(0)
        _, token, written = backend.set_state(b"2", token)
        assert written
        assert backend.get_state() == (b"2", token)
        client.close()


def test_client_reconnects_after_a_short_etcd_outage():
    with EtcdServer() as server:
        client = EtcdClient(server.endpoints, timeout=2.0)
        client.put("/k", b"1")
        server.stop_member(0)
        with pytest.raises(RendezvousConnectionError):
            client.get("/k")
        server.start_member(0)
        deadline = time.monotonic() + 5
        while True:
            try:
                assert client.get("/k").value == b"1"
                break
            except RendezvousConnectionError:
                assert time.monotonic() < deadline, "client did not reconnect within 5 s"
                time.sleep(0.1)
        client.close()


def test_watch_delivers_every_event_across_an_etcd_restart():
    with EtcdServer() as server:
        client = EtcdClient(server.endpoints, timeout=2.0)
        start = client.put("/w/a", b"0") + 1
        watch = Watch(client, "/w/", start_revision=start, prefix=True)
        try:
            for i in range(1, 4):
                client.put("/w/a", str(i).encode())
            server.stop_member(0)
            server.start_member(0)
            writer = EtcdClient(server.endpoints, timeout=5.0)
            for i in range(4, 7):
                writer.put("/w/a", str(i).encode())
            writer.delete("/w/a")
            seen = []
            deadline = time.monotonic() + 10
            while len(seen) < 7 and time.monotonic() < deadline:
                event = watch.get(timeout=0.5)
                if event is not None:
                    seen.append(event)
            assert [e.value for e in seen[:6]] == [str(i).encode() for i in range(1, 7)]
            assert seen[6].type is EventType.DELETE
            assert watch.reconnects >= 1
            writer.close()
        finally:
            watch.close()
            client.close()


def _auth_enable(endpoints: str, password: str) -> None:
    client = EtcdClient(endpoints, timeout=3.0)
    client._call("AuthStub", "UserAdd", etcdrpc.AuthUserAddRequest(name="root", password=password))
    client._call("AuthStub", "UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"))
    client._call("AuthStub", "AuthEnable", etcdrpc.AuthEnableRequest())
    client.close()


def _streams_work(client: EtcdClient) -> None:
    """A watch hears a put, and a 2 s lease outlives 3 s: both streams got through (auth, TLS)."""
    session = Session(client, ttl=2)
    start = client.put("/streams/probe", b"0")
    with Watch(client, "/streams/", start_revision=start + 1, prefix=True) as watch:
        client.put("/streams/a", b"1")
        event = watch.get(timeout=5)
        assert event is not None and (event.type, event.key, event.value) == (EventType.PUT, b"/streams/a", b"1")
    time.sleep(3)
    assert session.alive and client.lease_ttl(session.lease_id) > 0
    session.close()
    assert client.lease_ttl(session.lease_id) == -1


def test_user_and_password_auth():
    with EtcdServer() as server:
        _auth_enable(server.endpoints, "s3cret")
        client = EtcdClient(server.endpoints, timeout=3.0, user="root", password="s3cret")
        backend = EtcdRendezvousBackend(client, "job")
        _, token, written = backend.set_state(b"x")
        assert written and backend.get_state() == (b"x", token)
        _streams_work(client)
        client.close()
        with pytest.raises(RendezvousConnectionError, match="refused the credentials"):
            EtcdClient(server.endpoints, timeout=3.0, user="root", password="wrong").get("/k")
        with pytest.raises(RendezvousConnectionError, match="refused the credentials"):
            EtcdClient(server.endpoints, timeout=3.0).put("/k", b"v")


def _openssl(*args: str) -> None:
    import subprocess

    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def tls_files(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    d = tmp_path
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(d / "san.cnf"),
            "-out",
            str(d / f"{name}.pem"),
        )
    return d


def test_tls_with_a_client_certificate(tls_files):
    d = tls_files
    tls = ServerTLS(str(d / "server.pem"), str(d / "server.key"), str(d / "ca.pem"))
    with EtcdServer(tls=tls) as server:
        assert server.endpoints.startswith("https://")
        client = EtcdClient(
            server.endpoints,
            timeout=5.0,
            ca_cert=str(d / "ca.pem"),
            cert_key=str(d / "client.key"),
            cert_cert=str(d / "client.pem"),
        )
        client.put("/tls", b"ok")
        assert client.get("/tls").value == b"ok"
        _streams_work(client)
        client.close()
        anonymous = EtcdClient(server.endpoints, timeout=2.0, ca_cert=str(d / "ca.pem"))
        with pytest.raises(RendezvousConnectionError):
            anonymous.get("/tls")
        anonymous.close()


def test_streams_cost_no_thread_each(etcd_endpoints, key_prefix):
    """Watches and lease keep-alives are tasks on one loop: 40 of each add at most a few threads."""
    client = EtcdClient(etcd_endpoints, timeout=5.0)
    before = threading.active_count()
    sessions = [Session(client, ttl=2) for _ in range(40)]
    start = client.put(f"{key_prefix}/probe", b"0")
    watches = [Watch(client, f"{key_prefix}/w{i}", start_revision=start + 1) for i in range(40)]
    try:
        for i in (0, 39):
            client.put(f"{key_prefix}/w{i}", b"v")
            event = watches[i].get(timeout=5)
            assert event is not None and event.value == b"v"
        time.sleep(1.0)  # every session has sent a keep-alive (TTL/3 = 0.67 s)
        assert all(s.alive for s in sessions)
        assert threading.active_count() - before <= 4, threading.enumerate()
    finally:
        for watch in watches:
            watch.close()
        for session in sessions:
            session.close()
        client.close()


def _watch_messages(endpoint: str) -> float:
    """Messages etcd received on Watch streams so far (creates, progress requests, cancels)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("grpc_server_msg_received_total{") and 'grpc_method="Watch"' in line
    )


def test_a_quiet_watch_asks_for_progress_only_while_no_lease_renewal_vouches_for_its_member(monkeypatch):
    monkeypatch.setattr(Watch, "PROBE_EVERY", 0.4)
    monkeypatch.setattr(Watch, "SILENCE", 2.0)
    with EtcdServer() as server:
        client = EtcdClient(server.endpoints, timeout=5)
        try:
            counts = {}
            for renewed in (False, True):
                session = Session(client, 10, renew_deadline=4, interval=0.2) if renewed else None
                start = _watch_messages(server.endpoints)
                watch = Watch(client, f"/quiet-{renewed}", start_revision=1)
                time.sleep(3.0)
                counts[renewed] = _watch_messages(server.endpoints) - start - 1  # less the create request
                watch.close()
                if session is not None:
                    session.close()
            print(
                f"\nprogress requests of a watch quiet for 3 s: {counts[False]:.0f} alone, {counts[True]:.0f} "
                f"beside a lease renewed every 0.2 s"
            )
            assert counts[False] >= 4, "a quiet watch with nothing else on its connection must ask its member"
            assert counts[True] <= 1, "renewals answered on the same connection already say the member is alive"
        finally:
            client.close()


def test_a_big_job_s_quiet_watch_waits_for_its_slower_renewals_before_it_asks_for_progress():
    """A job of more than 1024 nodes renews its leases less often (every 2-3.5 s, docs/scale.md): its
    watches wait as long, so that a quiet watch still costs etcd nothing while the renewals come --
    with a one-second wait it would ask between every two of them (K nodes: K requests a second)."""
    with EtcdServer() as server:
        client = EtcdClient(server.endpoints, timeout=5)
        session = Session(client, 15, renew_deadline=14, interval=2.5)
        try:
            start = _watch_messages(server.endpoints)
            watch = Watch(client, "/quiet-big", start_revision=1)
            time.sleep(8.0)
            asked = _watch_messages(server.endpoints) - start - 1  # less the create request
            reopened = watch.reconnects
            watch.close()
            print(f"\nprogress requests of a watch quiet for 8 s beside renewals every 2.5 s: {asked:.0f}")
            assert asked <= 1 and reopened == 0, (asked, reopened)
        finally:
            session.close()
            client.close()
