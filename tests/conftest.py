"""The real etcd the integration tests talk to, once per session (see tests/etcd_fixture.py):
``ELASTIC_TEST_ETCD`` = ``container`` | ``binary`` | ``endpoints``; unset, ``ETCD_ENDPOINTS`` if set,
else a container when a Docker engine answers, else the bundled etcd binary. Each test gets its own
key prefix.
"""

from __future__ import annotations

import compileall
import os
import uuid

import pytest

from rendezvous import EtcdClient, EtcdServer

from .etcd_fixture import (
    EtcdContainer,
    FixtureError,
    chosen_mode,
    discard_image,
    docker_client,
    held_image,
    why_no_engine,
)


def pytest_configure(config):
    """A mode that cannot be had is one clear line and no test run, never a silent fallback."""
    try:
        mode = chosen_mode()
    except FixtureError as exc:
        raise pytest.UsageError(str(exc)) from None
    if mode == "container" and os.environ.get("ELASTIC_TEST_ETCD") and docker_client() is None:
        raise pytest.UsageError(f"ELASTIC_TEST_ETCD=container: no Docker engine answers ({why_no_engine()})")
    config._elastic_etcd_mode = mode
    if not hasattr(config, "workerinput"):  # once, in the process that starts the pytest-xdist workers
        _compile_sources()


# The project's packages (and these tests), imported from this checkout by every agent, worker, reaper
# and elastic-ctl the tests start.
SOURCES = ("elastic", "launcher", "lighthouse", "rendezvous", "tests")


def _compile_sources() -> None:
    """Write their bytecode once. Where writing it is turned off (PYTHONDONTWRITEBYTECODE=1, as on CI
    machines) nothing else does -- an installed wheel has it from pip -- and each of the suite's
    thousands of processes would compile what it imports again: 0.25 s of CPU an agent."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in SOURCES:
        compileall.compile_dir(os.path.join(root, name), quiet=2)


_HEADERS = {
    "container": "an etcd container per test session (each pytest-xdist worker is one)",
    "binary": "the bundled etcd binary, one per test session (each pytest-xdist worker is one)",
    "endpoints": "the cluster named by ETCD_ENDPOINTS",
}


def pytest_report_header(config):
    """Which etcd the tests use, also under pytest-xdist (whose workers' own lines are not shown)."""
    return f"etcd for the tests: {_HEADERS[config._elastic_etcd_mode]}"


# The files that take longest (test time on 2 cores, from --durations), first: under --dist loadfile
# a file runs on one worker, and a long one started last leaves the other worker idle until it ends.
LONGEST_FIRST = (
    "tests/hangs/test_hangs.py",
    "tests/faults/test_etcd_faults.py",
    "tests/parity/test_launcher_parity.py",
    "tests/faults/test_frozen_nodes.py",
    "tests/parity/test_launch_api.py",
    "tests/torch/test_inprocess.py",
    "tests/slurm/test_slurm.py",
    "tests/faults/test_agent_faults.py",
    "tests/ops/test_etcd_health.py",
    "tests/torch/test_checkpoint.py",
    "tests/faults/test_loss_while_forming.py",
    "tests/torch/test_stragglers.py",
    "tests/e2e/test_run.py",
    "tests/torch/test_examples.py",
    "tests/faults/test_soak.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: every other test keeps its place)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def _say(config, line: str) -> None:
    """One line on the terminal, past output capture (the fixture runs inside a test's setup)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


@pytest.fixture(scope="session")
def etcd_endpoints(request):
    """``host:port[,...]`` of a real etcd for this test session."""
    mode = request.config._elastic_etcd_mode
    if mode == "endpoints":
        endpoints = os.environ["ETCD_ENDPOINTS"]
        _say(request.config, f"etcd for the tests: the cluster at {endpoints} (ETCD_ENDPOINTS)")
        yield endpoints
        return
    if mode == "container":
        client = docker_client()
        if client is None:
            pytest.fail(f"no Docker engine answers any more ({why_no_engine()})", pytrace=False)
        try:
            with held_image(client) as image:
                container = _start_container(client, image)
        except FixtureError as exc:
            pytest.fail(str(exc), pytrace=False)
        finally:
            client.close()
        _say(
            request.config,
            f"etcd for the tests: container {container.id[:12]} of {image.name} "
            f"(etcd {image.version}, {image.origin}) at {container.endpoints}",
        )
        try:
            yield container.endpoints
        finally:
            container.stop()
        return
    with EtcdServer() as server:
        _say(request.config, f"etcd for the tests: the bundled etcd binary at {server.endpoints}")
        yield server.endpoints


def _start_container(client, image):
    """The etcd container, answering; a locally built image that cannot start one is removed."""
    try:
        return EtcdContainer(image).start()
    except Exception as exc:  # noqa: BLE001 -- the engine's or the client's error: one line either way
        if image.origin != "registry":
            discard_image(client, image.name)
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise FixtureError(f"the etcd container of {image.name} did not start: {detail}") from exc


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
