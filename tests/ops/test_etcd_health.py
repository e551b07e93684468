"""The project as a tenant of the etcd it lives on, with real etcd processes, agents and workers:
a running job writes nothing, a finished job's keys expire, etcd's NOSPACE alarm is said plainly
and costs no running job its workers, and many jobs in a row leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rendezvous import EtcdClient, EtcdServer
from rendezvous.errors import RendezvousNoSpaceError
from rendezvous.etcd.server import find_etcd_binary
from rendezvous.job.catalog import list_jobs
from rendezvous.job.keys import JobKeys
from tests.e2e.cli_helpers import run, wait_for
from tests.hangs.helpers import Agent

BEATS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "beats.py")
WRITES = {"Put", "Txn", "DeleteRange", "LeaseGrant", "LeaseRevoke", "Compact"}


def _agent(endpoints: str, rdzv_id: str, *worker: str, nnodes: str = "2", conf: str = "", extra=()) -> Agent:
    conf = ",".join(c for c in ("last_call_timeout=0.5", conf) if c)
    args = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id]
    return Agent([*args, "--rdzv-conf", conf, "--monitor-interval", "0.05", *extra, BEATS, *worker])


def _calls(etcd: EtcdServer) -> dict[str, float]:
    """etcd's own count of the requests it handled (unary) and the messages it received (streams), by method."""
    with urllib.request.urlopen(f"{etcd.client_urls[0]}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("grpc_server_handled", "grpc_server_msg_received"):
            continue
        for sample in family.samples:
            method, kind = sample.labels.get("grpc_method", ""), sample.labels.get("grpc_type", "")
            if sample.name.endswith("_total") and (kind == "unary") == (family.name == "grpc_server_handled"):
                counts[method] = counts.get(method, 0.0) + sample.value
    return counts


def _revision(client: EtcdClient) -> int:
    return client.status().header.revision


def _finish(agents: list[Agent], timeout: float) -> list[int]:
    return [agent.wait(timeout) for agent in agents]


def test_a_running_job_with_heartbeating_workers_writes_nothing_to_etcd(tmp_path):
    stop = str(tmp_path / "stop")
    with EtcdServer() as etcd, EtcdClient(etcd.endpoints) as client:
        agents = [_agent(etcd.endpoints, "steady", "--stop", stop) for _ in range(2)]
        try:
            wait_for(lambda: all(a.count(r"round 1: ") for a in agents), 30, what="round 1 on both nodes")
            time.sleep(3.0)  # the workers beat; the agents watch them
            before, calls_before = _revision(client), _calls(etcd)
            time.sleep(15.0)
            after, calls_after = _revision(client), _calls(etcd)
            status = run(["status", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "steady"], tool_name="elastic-ctl")
            assert all(a.process.poll() is None for a in agents), [a.output for a in agents]
        finally:
            open(stop, "w").close()
        assert _finish(agents, 30) == [0, 0], [a.output for a in agents]
    delta = {m: calls_after.get(m, 0) - calls_before.get(m, 0) for m in calls_after}
    per_node_minute = {m: round(d / 2 * 4, 1) for m, d in sorted(delta.items()) if d}
    print(f"\nsteady state, requests a node a minute: {per_node_minute}; revision {before} -> {after}")
    assert after == before, f"etcd's revision moved {after - before} while nothing changed: {delta}"
    assert not {m: d for m, d in delta.items() if m in WRITES and d}, delta
    assert status.returncode == 0 and status.stdout.count(" s ago (rank ") == 2, status.stdout + status.stderr


def test_a_finished_jobs_keys_vanish_after_its_retention_and_prune_removes_one_kept_forever(tmp_path):
    with EtcdServer() as etcd, EtcdClient(etcd.endpoints) as client:
        # a retention of 10 s: with 3, a loaded machine's elastic-ctl list started after it had passed (CI 50)
        short = [_agent(etcd.endpoints, "short", "--seconds", "1", conf="retention=10") for _ in range(2)]
        kept = [_agent(etcd.endpoints, "kept", "--seconds", "1", conf="retention=0") for _ in range(2)]
        assert _finish(short + kept, 60) == [0, 0, 0, 0], [a.output for a in short + kept]
        jobs = {job.run_id: job for job in list_jobs(client, "/elastic")}
        assert jobs["short"].state.status.value == "closed" and jobs["short"].keys >= 2, jobs
        assert jobs["short"].expires_in is not None and 0 < jobs["short"].expires_in <= 10, jobs
        assert jobs["kept"].expires_in is None, jobs
        listed = run(["list", "--rdzv-endpoint", etcd.endpoints], tool_name="elastic-ctl")
        assert listed.returncode == 0 and "short" in listed.stdout and "never" in listed.stdout, listed.stdout
        print("\n" + listed.stdout)
        root = JobKeys("/elastic", "short").root
        wait_for(lambda: client.count_prefix(root) == 0, 20, interval=0.2, what="the short job's keys to expire")
        assert client.count_prefix(JobKeys("/elastic", "kept").root) > 0
        pruned = run(["prune", "--rdzv-endpoint", etcd.endpoints, "--older-than", "0s"], tool_name="elastic-ctl")
        assert pruned.returncode == 0 and "pruned 1 finished job: kept" in pruned.stdout, pruned.stdout
        assert client.count_prefix("/elastic/") == 0


def _fill(client: EtcdClient) -> int:
    """Write big values until etcd raises its NOSPACE alarm; how many went in."""
    for i in range(1000):
        try:
            client.put(f"/filler/{i}", b"x" * 500_000)
        except RendezvousNoSpaceError:
            return i
    raise AssertionError("etcd never ran out of space")


def _operator_fix(etcd: EtcdServer, client: EtcdClient) -> None:
    """What the line tells the operator to do, with etcdctl: free the space, compact, defragment, disarm."""
    etcdctl = os.path.join(os.path.dirname(find_etcd_binary()), "etcdctl")
    client.delete("/filler/", prefix=True)  # the other writer's data, deleted by its owner
    ctl = [etcdctl, f"--endpoints={etcd.endpoints}"]
    for command in (["compact", str(_revision(client))], ["defrag"], ["alarm", "disarm"]):
        done = subprocess.run([*ctl, *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_out_of_space_is_an_infrastructure_failure_said_plainly_and_a_running_job_keeps_its_workers(tmp_path):
    stop = str(tmp_path / "stop")
    with EtcdServer(extra_args=["--quota-backend-bytes=16777216"]) as etcd, EtcdClient(etcd.endpoints) as client:
        running = [_agent(etcd.endpoints, "running", "--stop", stop, conf="renew_deadline=4") for _ in range(2)]
        try:
            wait_for(lambda: all(a.count(r"round 1: ") for a in running), 30, what="round 1 of the running job")
            _fill(client)
            filled = time.monotonic()
            status = run(["status", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "running"], tool_name="elastic-ctl")
            listed = run(["list", "--rdzv-endpoint", etcd.endpoints], tool_name="elastic-ctl")
            started = time.monotonic()
            new = run(["--nnodes", "1", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "new", BEATS], timeout=60)
            refused_in = time.monotonic() - started
            # etcd stays full past the renew deadline (4 s here) and a former summary period (5 s):
            # a write anywhere in the running job's loop would stop its workers or say so by then.
            time.sleep(8.0)
            assert all(a.process.poll() is None for a in running), [a.output for a in running]
            assert not any(a.count("restarting|re-rendezvous|round 2") for a in running), [a.output for a in running]
            full_for = time.monotonic() - filled
            _operator_fix(etcd, client)
            after = run(["--nnodes", "1", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "after", BEATS,
                         "--seconds", "1"], timeout=60)  # fmt: skip
        finally:
            open(stop, "w").close()
        assert _finish(running, 30) == [0, 0], [a.output for a in running]
    last = new.stderr.strip().splitlines()[-1]
    print(f"\netcd full for {full_for:.1f} s; the new job's last line ({refused_in:.1f} s): {last}")
    assert status.returncode == 0 and "job running: running" in status.stdout, status.stdout + status.stderr
    assert listed.returncode == 0 and "running" in listed.stdout, listed.stdout + listed.stderr
    assert new.returncode == 200, new.stderr
    assert "out of space (NOSPACE alarm" in last and "etcdctl alarm disarm" in last and "worth a retry" in last, last
    assert "Traceback" not in new.stderr and refused_in < 20, new.stderr
    assert after.returncode == 0, after.stderr


def test_closing_a_job_waits_out_a_full_etcd_within_its_close_timeout_in_one_loop():
    """The close is one compare-and-swap loop through the store's update: while etcd is full it
    tries again once a second until its timeout (an operator may be freeing space), then closes;
    an update not asked to wait raises the NOSPACE error at once."""
    import threading

    from rendezvous.job.state import JobState, JobStatus
    from rendezvous.job.store import JobStateStore

    with EtcdServer(extra_args=["--quota-backend-bytes=16777216"]) as etcd, EtcdClient(etcd.endpoints) as client:
        store = JobStateStore(client, JobKeys("/elastic", "full"))
        store.update(lambda state: JobState("full", 1, JobStatus.RUNNING, 1, 1))
        _fill(client)
        closing = lambda state: JobState("full", 1, JobStatus.CLOSED, 1, 1, reason="done")  # noqa: E731
        with pytest.raises(RendezvousNoSpaceError):
            store.update(closing, tries=None, timeout=30)
        done: list = []
        waiting = threading.Thread(
            target=lambda: done.append(store.update(closing, tries=None, timeout=30, through_no_space=True))
        )
        started = time.monotonic()
        waiting.start()
        time.sleep(2.0)
        assert not done, "it closed while etcd was full"
        _operator_fix(etcd, client)
        waiting.join(30)
        took = time.monotonic() - started
        assert done and done[0][1].status is JobStatus.CLOSED, done
        assert store.read()[0].reason == "done"
        print(f"\nclosed {took:.1f} s after it was asked, etcd full for the first 2 s and more")


@pytest.mark.timeout(300)
def test_many_short_jobs_with_restarts_kills_and_hangs_leave_nothing_and_never_fill_etcd(tmp_path):
    """A soak: 12 jobs of 2 nodes, 2 at a time, against an etcd with a small quota and compaction."""
    args = ["--quota-backend-bytes=33554432", "--auto-compaction-mode=periodic", "--auto-compaction-retention=2s"]
    kinds = [
        ((), ()),
        (("--fail-once", "1"), ("--max-restarts", "1")),
        (("--hang-once", "0"), ("--max-restarts", "1", "--heartbeat-timeout", "1")),
        ((), ("kill",)),
    ]
    with EtcdServer(extra_args=args) as etcd, EtcdClient(etcd.endpoints) as client:
        for batch in range(6):
            jobs = []
            for j in range(2):
                worker, extra = kinds[(batch * 2 + j) % len(kinds)]
                rid, kill = f"soak-{batch}-{j}", extra == ("kill",)
                agents = [
                    _agent(etcd.endpoints, rid, "--seconds", "3", *worker, nnodes="1:2", conf="retention=3",
                           extra=() if kill else extra)
                    for _ in range(2)
                ]  # fmt: skip
                jobs.append((agents, kill))
            for agents, kill in jobs:
                if kill:
                    # in a round both formed: round 2 when the second came after the first's 0.5 s last call
                    wait_for(
                        lambda a=agents: all(x.count(r"round \d+: group rank") for x in a),
                        30,
                        what="a round of both",
                        story=lambda a=agents: [x.output for x in a],
                    )
                    os.kill(agents[1].process.pid, signal.SIGKILL)
            for agents, kill in jobs:
                codes = [a.wait(60) for a in agents]
                assert codes[0] == 0 and codes[1] == (-signal.SIGKILL if kill else 0), [a.output for a in agents]
        alarms = client._call("MaintenanceStub", "Alarm", _alarm_list())
        assert not list(alarms.alarms), alarms
        deadline = time.monotonic() + 15
        while list_jobs(client, "/elastic") and time.monotonic() < deadline:
            time.sleep(0.5)
        left, _ = client.get_prefix("/elastic/")
        assert not left, [(kv.key, kv.lease, kv.value[:80]) for kv in left]
        size = client.status().dbSize
    print(f"\n12 jobs done; etcd's database {size / 1024:.0f} KiB of a 32 MiB quota; nothing left under /elastic")
    assert size < 16 * 1024 * 1024


def _alarm_list():
    from etcd3 import etcdrpc

    return etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET)
