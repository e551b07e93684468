"""/healthz and /readyz through one job's phases, with real agents, workers and etcd: waiting for a
round, running, restarting after a worker failure, fenced while its link to etcd is cut (the fault
proxy), running again, closed. And what a bad request gets."""

from __future__ import annotations

import re
import signal
import subprocess

from tests.e2e.cli_helpers import run, run_id, tool, wait_for
from tests.faults.proxy import Proxy
from tests.hangs.helpers import Agent
from tests.readme_quotes import README

from .helpers import PHASED, endpoint_of, get, until


def test_the_probes_follow_a_job_through_its_phases(etcd_endpoints, tmp_path):
    host, port = etcd_endpoints.split(",")[0].rsplit(":", 1)
    rdzv_id, answers = run_id(), []
    common = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-id",
        rdzv_id,
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "2",
        "--shutdown-timeout",
        "5",
        "--http-port",
        "0",
        "--http-host",
        "127.0.0.1",
        "--rdzv-conf",
        "last_call_timeout=1,renew_deadline=4",
        PHASED,
        str(tmp_path),
        "--run",
        "120",
        "--fail-rank",
        "1",
        "--fail-after",
        "2",
        "--linger",
        "2",
    ]
    with Proxy(host, int(port)) as proxy:
        first = Agent(["--rdzv-endpoint", proxy.endpoint, *common])
        agents = [first]
        try:
            url = "http://" + endpoint_of(first.lines)

            def seen(phase: str, path: str, status: int, words: str, timeout: float = 30) -> None:
                answers.append((phase, path, status, until(url + path, status, words, timeout)))

            seen("waiting for the second node", "/healthz", 200, "ok: rendezvous, lease renewed")
            seen("waiting for the second node", "/readyz", 503, "not ready: rendezvous")
            agents.append(Agent(["--rdzv-endpoint", etcd_endpoints, *common]))
            seen("running", "/readyz", 200, "ready: 1 workers running in round 1")
            seen("running", "/healthz", 200, "ok: running, lease renewed")
            seen("rank 1 failed, the group stopping", "/readyz", 503, "not ready: restarting")
            seen("restarted", "/readyz", 200, "ready: 1 workers running in round 2")
            proxy.cut()  # until the fence shows: past the renew deadline (4 s), within the lease (15 s)
            seen("cut from etcd past the renew deadline", "/healthz", 503, "not live: no lease renewal for", 15)
            seen("cut from etcd past the renew deadline", "/readyz", 503, "not ready")
            proxy.heal()
            seen("link healed, rejoined", "/healthz", 200, "ok: running", 30)
            seen("link healed, rejoined", "/readyz", 200, "ready: 1 workers running", 30)
            closed = run(
                ["close", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, "--reason", "probe test"],
                tool_name="elastic-ctl",
            )
            assert closed.returncode == 0, closed.stderr
            codes = [agent.wait(60) for agent in agents]
            answers.append(("closed by an operator", "/healthz", *get(url + "/healthz")))
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\nseen so far: {answers}\n" + "\n---\n".join(a.output for a in agents)
            ) from None
        finally:
            for agent in agents:
                agent.kill()
    assert codes == [4, 4], [a.output for a in agents]
    assert answers[-1][2] == 0, answers[-1]  # nothing listens once the agent is gone
    print("\n" + "\n".join(f"{phase:<42} {path:<9} {status:>3}  {body}" for phase, path, status, body in answers))
    _matches_the_readme_table(answers)


def _matches_the_readme_table(answers: list[tuple[str, str, int, str]]) -> None:
    """The README's table of these phases quotes what a real run answers (figures and '(...)' aside)."""
    rows = {}
    for line in README.split("| phase | `/healthz` | `/readyz` |", 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        phase, healthz, readyz = (cell.strip() for cell in line.strip("|").split("|"))
        rows[phase] = {"/healthz": healthz, "/readyz": readyz}
    assert {phase for phase, *_ in answers} == set(rows), (sorted(rows), answers)
    for phase, path, status, body in answers:
        cell = rows[phase][path]
        if cell.startswith("connection refused"):
            assert status == 0, (phase, path, status, body)
            continue
        said = re.match(r"(\d{3}) `", cell)
        assert said and int(said.group(1)) == status, (phase, path, cell, status, body)
        assert any(re.fullmatch(_pattern(quote), body) for quote in re.findall(r"`([^`]*)`", cell)), (cell, body)


def _pattern(quote: str) -> str:
    """A quoted answer as a pattern: its figures any figures, ``(...)`` anything."""
    pattern = re.escape(quote).replace(r"\(\.\.\.\)", ".*")
    return re.sub(r"\d+(?:\\\.\d+)?", r"[\\d.]+", pattern)


def test_bad_requests_get_404_or_405_and_the_port_is_the_one_asked_for(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = Agent(
        [
            "--standalone",
            "--nproc-per-node",
            "1",
            "--http-port",
            str(port),
            "--http-host",
            "127.0.0.1",
            PHASED,
            str(tmp_path),
            "--run",
            "30",
        ]
    )
    try:
        assert endpoint_of(agent.lines) == f"127.0.0.1:{port}"
        url = f"http://127.0.0.1:{port}"
        until(url + "/readyz", 200, "ready", 30)
        assert get(url + "/nope")[0] == 404 and "try /metrics" in get(url + "/nope")[1]
        post = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url + "/metrics"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert post.stdout == "405", post
        status, body = get(url + "/metrics")
        assert status == 200 and "elastic_workers_running{" in body and "Traceback" not in body
        busy = subprocess.run(
            [
                tool("elastic-run"),
                "--standalone",
                "--http-port",
                str(port),
                "--http-host",
                "127.0.0.1",
                PHASED,
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [line for line in busy.stderr.splitlines() if line.strip() and "Setting OMP" not in line]
        assert busy.returncode == 2 and lines[-1].startswith(
            f"elastic-run: error: --http-port {port}: cannot listen"
        ), busy.stderr
        assert "Traceback" not in busy.stderr
    finally:
        agent.kill()


def test_an_agent_told_to_stop_says_stopped_while_its_workers_stop(etcd_endpoints, tmp_path):
    """SIGTERM: the workers get their grace (this one lingers 3 s); meanwhile /metrics has the agent
    in state stopped (not running), /healthz says so and /readyz is not ready; the job stays open."""
    agent = Agent(
        [
            "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id(),
            "--shutdown-timeout", "10", "--http-port", "0", "--http-host", "127.0.0.1",
            PHASED, str(tmp_path), "--run", "120", "--linger", "3",
        ]
    )  # fmt: skip
    try:
        url = "http://" + endpoint_of(agent.lines)
        until(url + "/readyz", 200, "ready: 1 workers running in round 1", 30)
        wait_for(lambda: list(tmp_path.glob("0.0.*")), 30, what="the worker to take its SIGTERM handler")
        agent.process.send_signal(signal.SIGTERM)
        metrics = until(url + "/metrics", 200, 'state="stopped"} 1.0', 3)
        assert re.search(r'^elastic_agent_state\{[^}]*state="running"\} 0\.0$', metrics, re.M), metrics
        assert until(url + "/healthz", 200, "ok: stopped", 3)
        assert get(url + "/readyz")[0] == 503
        assert agent.wait(30) == 143
    finally:
        agent.kill()
