"""A real Prometheus server scrapes the agents of a real job: the restart counter goes up after a
worker failure, and the world size goes down after a node is lost. Skipped, saying why, where no
``prometheus`` binary is installed (.ci/run installs Debian's package when it runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from tests.e2e.cli_helpers import run_id
from tests.hangs.helpers import Agent

from .helpers import PHASED, endpoint_of, get

PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    def __init__(self, targets: list[str], workdir: str) -> None:
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as handle:
            handle.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                f"  - job_name: elastic\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
            )
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
                f"--web.listen-address={self.url[7:]}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(workdir, "prometheus.log"), "w"),
        )

    def query(self, expr: str) -> dict[str, float]:
        """instance -> value of an instant query (empty while Prometheus is not up)."""
        status, body = get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        if status != 200:
            return {}
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in json.loads(body)["data"]["result"]}

    def series(self, expr: str) -> list[dict[str, str]]:
        """The label sets an instant query returns (empty while Prometheus is not up)."""
        status, body = get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        return [r["metric"] for r in json.loads(body)["data"]["result"]] if status == 200 else []

    def until(self, expr: str, check, timeout: float, what: str) -> dict[str, float]:
        deadline, seen = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            seen = self.query(expr)
            if seen and check(seen):
                return seen
            time.sleep(0.25)
        raise AssertionError(f"Prometheus never showed {what} within {timeout} s ({expr} = {seen})")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "elastic-dashboard.json"


def _every_panel_returns_series(prometheus: Prometheus, rdzv_id: str) -> None:
    """Each query of the Grafana dashboard, with its variables filled in as Grafana would, returns series."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {"$run_id": rdzv_id, "$__rate_interval": "1m", "$__range": "10m"}
    shown = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'run_id=~"$run_id"' in expr, f"panel {panel['title']!r} is not filtered by the job: {expr}"
            for name, value in variables.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"panel {panel['title']!r}: a variable is left in {expr}"
            prometheus.until(expr, lambda v: len(v) >= 1, 20, f"series for panel {panel['title']!r}")
            found = prometheus.series(expr)
            shown.append(f"{panel['title']} [{target['refId']}]: {len(found)} series {found}")
    print("\n" + "\n".join(shown))


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get install prometheus)")
def test_prometheus_sees_the_restart_counter_rise_and_the_world_shrink(etcd_endpoints, tmp_path):
    rdzv_id = run_id()
    out = tmp_path / "out"
    out.mkdir()
    args = [
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        f"127.0.0.1:{_free_port()},{etcd_endpoints}",  # a member down: each agent's first try fails over
        "--rdzv-id",
        rdzv_id,
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "2",
        "--http-port",
        "0",
        "--http-host",
        "127.0.0.1",
        "--rdzv-conf",
        "last_call_timeout=2",
        "--heartbeat-timeout",
        "2",
        PHASED,
        str(out),
        "--run",
        "120",
        "--fail-rank",
        "2",
        "--fail-after",
        "6",
        "--hang-rank",
        "1",
    ]
    agents = [Agent(args) for _ in range(3)]
    prometheus = None
    try:
        targets = [endpoint_of(agent.lines) for agent in agents]
        prometheus = Prometheus(targets, str(tmp_path))
        job = f'run_id="{rdzv_id}"'
        before = prometheus.until(
            f"elastic_job_restarts{{{job}}}", lambda v: len(v) == 3, 30, "3 agents' restart count"
        )
        failures_before = prometheus.query(f'sum(elastic_restarts_total{{{job},cause="worker_failure"}})')
        after = prometheus.until(  # rank 2 failed, then rank 1 hung: two restarts
            f"elastic_job_restarts{{{job}}}",
            lambda v: len(v) == 3 and set(v.values()) == {2.0},
            60,
            "the restart count at 2 on every node",
        )
        prometheus.until(
            f'elastic_hangs_total{{{job},culprit="1"}}',
            lambda v: len(v) == 3 and set(v.values()) == {1.0},
            20,
            "the hang of rank 1 counted on every node",
        )
        failures_after = prometheus.until(  # the job's cause on every node, not only on the failed one's
            f'elastic_restarts_total{{{job},cause="worker_failure"}}',
            lambda v: len(v) == 3 and set(v.values()) == {1.0},
            20,
            "one worker_failure restart on each of the 3 nodes",
        )
        changes = prometheus.query(f'sum(elastic_restarts_total{{{job},cause="membership_change"}})')
        assert list(changes.values()) == [0.0], f"the worker failure was counted as a membership change: {changes}"
        _every_panel_returns_series(prometheus, rdzv_id)
        worlds = prometheus.until(
            f"elastic_world_size{{{job}}}", lambda v: set(v.values()) == {3.0}, 20, "world size 3"
        )
        victim = agents[0]
        victim.process.kill()
        survivors = set(targets[1:])
        shrunk = prometheus.until(
            f"elastic_world_size{{{job}}} and on(instance) up == 1",
            lambda v: set(v) == survivors and set(v.values()) == {2.0},
            40,
            "world size 2 on the survivors",
        )
        print(
            f"\nelastic_job_restarts before the failure: {sorted(before.values())}, after: {sorted(after.values())}"
            f'\nsum(elastic_restarts_total{{cause="worker_failure"}}): {list(failures_before.values())} -> '
            f'elastic_restarts_total{{cause="worker_failure"}} by node {sorted(failures_after.values())}'
            f"\nelastic_world_size: {sorted(worlds.values())} -> after a node was "
            f"killed {sorted(shrunk.values())} (survivors {sorted(shrunk)})"
        )
        assert set(before.values()) == {0.0} and set(after.values()) == {2.0}
    finally:
        if prometheus is not None:
            prometheus.close()
        for agent in agents:
            agent.kill()
