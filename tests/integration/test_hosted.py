"""A c10d line's etcd on this machine (``launcher.hosted.host_etcd``), with real etcd processes:
one host however many agents start at once, a port something else holds is joined, not served."""

from __future__ import annotations

import socket
import threading

from launcher.hosted import Hosting, host_etcd
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.ports import free_port


def test_agents_starting_at_once_on_one_machine_make_one_host_the_others_join():
    """Both find the port free, and a second etcd on a taken port still looks healthy -- through the
    first; the lock makes one of them the host."""
    hosting, said = Hosting("127.0.0.1", free_port("127.0.0.1")), []
    start, results, done = threading.Barrier(3), [], threading.Event()

    def agent() -> None:
        start.wait()
        results.append(host_etcd(hosting, said.append))
        done.wait(60)  # etcd dies with the thread that started it (its parent-death signal)

    threads = [threading.Thread(target=agent) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(600):
        if len(results) == 3:
            break
        threading.Event().wait(0.1)
    hosts = [server for server in results if server is not None]
    try:
        assert len(results) == 3 and len(hosts) == 1, said
        assert sum("hosts the job's etcd" in line for line in said) == 1, said
        assert sum("served on this machine already" in line for line in said) == 2, said
        with EtcdClient(hosting.endpoint) as client:
            client.put("/hosted/check", b"1")
            assert client.get("/hosted/check").value == b"1"
    finally:
        for server in hosts:
            server.stop()
        done.set()
    again = host_etcd(hosting, said.append)
    assert again is not None, "the lock outlived its host"  # the next job on this machine may host
    again.stop()


def test_a_port_something_else_listens_on_is_joined_not_served():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        said = []
        assert host_etcd(Hosting("127.0.0.1", other.getsockname()[1]), said.append) is None
    assert said and "served on this machine already" in said[0]


def test_is_host_false_never_serves_and_true_serves_whatever_the_name():
    said = []
    assert host_etcd(Hosting("127.0.0.1", free_port("127.0.0.1"), is_host=False), said.append) is None
    assert said == []
    server = host_etcd(Hosting("127.0.0.1", free_port("127.0.0.1"), is_host=True), said.append)
    try:
        assert server is not None
    finally:
        server.stop()
