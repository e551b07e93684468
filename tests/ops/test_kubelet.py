"""What a kubelet does to an agent, with real processes: two agents started with nothing but the
environment of examples/kubernetes/indexed-job.yaml (loopback addresses and a job id swapped in),
probed until ready; one is sent SIGTERM (the pod is deleted or preempted) with SIGKILL after the
manifest's terminationGracePeriodSeconds, as the kubelet would. Its workers must be gone, its exit
code the table's (143: retry), and the job left open for the other node."""

from __future__ import annotations

import glob
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import yaml

import elastic
from tests.e2e.cli_helpers import run, run_id, wait_for
from tests.hangs.helpers import Agent

from .helpers import PHASED, endpoint_of, until

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "indexed-job.yaml"


def _pod_environment(endpoints: str, rdzv_id: str) -> tuple[dict[str, str], list[str], float]:
    """(environment, command, grace period) of the manifest's container, for a pod on loopback."""
    job = yaml.safe_load(MANIFEST.read_text())
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(
        PET_RDZV_ID=rdzv_id,
        PET_LOCAL_ADDR="127.0.0.1",
        PET_RDZV_ENDPOINT=endpoints,
        PET_HTTP_PORT="0",
        PET_HTTP_HOST="127.0.0.1",
    )  # fieldRefs, and what differs on loopback; the etcd here has no auth
    env.update(
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], HOME=os.environ.get("HOME", "/root")
    )
    return env, container["command"], float(pod["terminationGracePeriodSeconds"])


def test_an_agent_of_the_manifest_stops_on_sigterm_within_the_grace_period_and_leaves_the_job_open(
    etcd_endpoints, tmp_path
):
    rdzv_id = run_id()
    env, command, grace = _pod_environment(etcd_endpoints, rdzv_id)
    assert command[0] == "elastic-run"
    argv = [PHASED, str(tmp_path), "--run", "120", "--linger", "2"]  # a save of 2 s on SIGTERM
    pods = [Agent(argv, env=env) for _ in range(2)]
    try:
        urls = ["http://" + endpoint_of(pod.lines) for pod in pods]
        for url in urls:
            until(url + "/readyz", 200, "ready: 2 workers running", 60)
        victim = pods[0]
        ranks = victim.ranks()

        def started() -> list[int]:  # the victim's workers, by the files they wrote when they started
            return [
                int(p.rsplit(".", 1)[1])
                for p in glob.glob(str(tmp_path / "*.0.*"))
                if int(Path(p).name.split(".")[0]) in ranks
            ]

        mine = wait_for(lambda: len(started()) == 2 and started(), 30, what="the victim's 2 workers")
        sent = time.monotonic()
        victim.process.send_signal(signal.SIGTERM)
        try:
            code = victim.process.wait(timeout=grace)
        except Exception:  # the kubelet's SIGKILL after the grace period
            victim.process.kill()
            code = victim.process.wait(timeout=10)
        took = time.monotonic() - sent
        assert code == 128 + signal.SIGTERM, victim.output  # the table: stopped by a signal, worth a retry
        assert took < grace, f"the agent needed the kubelet's SIGKILL ({took:.1f} s)"
        assert len(mine) == 2 and not [
            p for p in mine if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
        ]
        state = elastic.get_state(etcd_endpoints, rdzv_id)
        assert state is not None and state.status != "closed", state
        survivor = until(urls[1] + "/readyz", 503, "not ready", 30)
        print(
            f"\nSIGTERM: the agent exited {code} after {took:.1f} s (grace {grace:g} s, PET_SHUTDOWN_TIMEOUT "
            f"{env['PET_SHUTDOWN_TIMEOUT']}); its workers {mine} are gone; the job is {state.status}; "
            f"the other pod: {survivor}"
        )
    finally:
        run(["close", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl")
        for pod in pods:
            pod.kill()


def test_a_stopped_worker_is_woken_to_take_its_sigterm_instead_of_holding_the_agent_for_the_grace(
    etcd_endpoints, tmp_path
):
    """A worker that is stopped (SIGSTOP, a frozen cgroup) when its agent is told to stop gets its
    SIGTERM with a SIGCONT: it saves and exits at once, not SIGKILLed after the whole grace."""
    agent = Agent(
        [
            "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id(),
            "--shutdown-timeout", "20", PHASED, str(tmp_path), "--run", "120",
        ]
    )  # fmt: skip
    try:
        started = wait_for(lambda: glob.glob(str(tmp_path / "0.0.*")), 60, what="the worker")
        worker = int(started[0].rsplit(".", 1)[1])
        os.kill(worker, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(worker).status() == psutil.STATUS_STOPPED, 10, what="the worker to stop")
        sent = time.monotonic()
        agent.process.send_signal(signal.SIGTERM)
        seen: list[str] = []  # what became of the worker 2 s after the agent's SIGTERM
        look = threading.Thread(target=lambda: seen.append(_state_after(worker, 2.0)), daemon=True)
        look.start()
        code = agent.wait(30)
        took = time.monotonic() - sent
        look.join(5)
        woken = seen[0] if seen else "not looked at"
    finally:
        agent.kill()
    print(f"\nthe agent stopped a stopped worker in {took:.2f} s (grace 20 s); 2 s in, the worker was {woken}")
    assert code == 128 + signal.SIGTERM, agent.output
    story = f"2 s after the SIGTERM the worker was {woken}\n{agent.output}"
    assert took < 5, f"the stopped worker held the agent {took:.1f} s: it was not woken for its SIGTERM; {story}"


def _state_after(pid: int, seconds: float) -> str:
    time.sleep(seconds)
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
