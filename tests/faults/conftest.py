"""Fixtures of the fault suite: a fresh 3-member etcd cluster per test, proxies, and agents that are
always killed at the end (with their workers, through the reaper), whatever the test did."""

from __future__ import annotations

import os
import signal

import pytest

from rendezvous.etcd.server import EtcdCluster

from .helpers import Agent, member_endpoint
from .proxy import Proxy


@pytest.fixture
def cluster():
    with EtcdCluster(3) as etcd:
        yield etcd
        for member in etcd.members:  # a member a test froze must be able to stop
            if member.process is not None and member.process.poll() is None:
                try:
                    os.kill(member.process.pid, signal.SIGCONT)
                except OSError:
                    pass


@pytest.fixture
def proxies():
    made: list[Proxy] = []

    def make(host: str, port: int) -> Proxy:
        proxy = Proxy(host, port).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def via_proxies(cluster, proxies):
    """Endpoints for one agent through a proxy per member, and those proxies (to cut or slow)."""

    def make() -> tuple[str, list[Proxy]]:
        own = [proxies(m.host, m.client_port) for m in cluster.members]
        return ",".join(p.endpoint for p in own), own

    return make


@pytest.fixture
def agents(tmp_path):
    started: list[Agent] = []

    def start(endpoints: str, rdzv_id: str, nnodes: str, out: str, seconds: float, conf: str = "", **more) -> Agent:
        log = str(tmp_path / f"agent{len(started)}.log")
        agent = Agent(endpoints, rdzv_id, nnodes, out, seconds, log, conf, **more)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()


__all__ = ["member_endpoint"]
