"""etcd credentials from the environment, a least-privilege role, and a password that is never shown:
not in ps, not in the workers' environment, not in an error line."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from etcd3 import etcdrpc
from etcd3.etcdrpc import auth_pb2

from rendezvous import EtcdClient, EtcdServer, RendezvousCredentialsError
from rendezvous.etcd.txn import prefix_range_end

from .cli_helpers import PROBE, agent_args, finish, records, run, run_id, start, wait_for

ROOT_PASSWORD = "root-Secr3t-pw"
PASSWORD = "trainer-Secr3t-pw"


@pytest.fixture(scope="module")
def auth_etcd():
    """etcd with auth on: root, and a user whose role may only read and write keys under /elastic/
    and /elastic-lighthouse/."""
    with EtcdServer() as server:
        admin = EtcdClient(server.endpoints, timeout=5)
        call = admin._call
        call("AuthStub", "UserAdd", etcdrpc.AuthUserAddRequest(name="root", password=ROOT_PASSWORD))
        call("AuthStub", "UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"))
        call("AuthStub", "RoleAdd", etcdrpc.AuthRoleAddRequest(name="elastic-job"))
        for prefix in (b"/elastic/", b"/elastic-lighthouse/"):  # jobs, and torchft Lighthouses (--lighthouse)
            permission = auth_pb2.Permission(
                permType=auth_pb2.Permission.READWRITE, key=prefix, range_end=prefix_range_end(prefix)
            )
            call(
                "AuthStub",
                "RoleGrantPermission",
                etcdrpc.AuthRoleGrantPermissionRequest(name="elastic-job", perm=permission),
            )
        call("AuthStub", "UserAdd", etcdrpc.AuthUserAddRequest(name="trainer", password=PASSWORD))
        call("AuthStub", "UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user="trainer", role="elastic-job"))
        call("AuthStub", "AuthEnable", etcdrpc.AuthEnableRequest())
        admin.close()
        yield server.endpoints


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_a_prefix_only_role_runs_a_job_and_elastic_ctl_with_credentials_from_the_environment(
    auth_etcd, password_file, tmp_path
):
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD_FILE": password_file}
    out = tmp_path / "out"
    out.mkdir()
    rdzv_id = run_id()
    agents = [
        start(agent_args(auth_etcd, rdzv_id, "2", nproc=1) + [PROBE, str(out), "--run", "3"], env=env) for _ in range(2)
    ]
    try:
        wait_for(lambda: len(records(str(out), 0)) == 2, 30, what="2 workers")
        shown = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        status = run(["status", "--rdzv-endpoint", auth_etcd, "--rdzv-id", rdzv_id], env=env, tool_name="elastic-ctl")
        results = [finish(agent, timeout=60) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert [code for code, _ in results] == [0, 0], results
    # The job's state read with the role's credentials: "running", or "succeeded" where a busy machine
    # took longer to start elastic-ctl than the workers' 3 s (local CI saw it once).
    assert status.returncode == 0, status.stderr
    assert re.search(rf"^job {rdzv_id}: (running|succeeded), round 1, world size 2", status.stdout, re.M), status.stdout
    assert PASSWORD not in shown, "the password shows in ps"
    for record in records(str(out), 0).values():
        assert not [name for name in record["env"] if name.startswith("ELASTIC_ETCD_")], "credentials reached a worker"
        assert not [name for name, value in record["env"].items() if PASSWORD in value]
    for _, output in results:
        assert PASSWORD not in output
    anonymous = run(
        ["status", "--rdzv-endpoint", auth_etcd, "--rdzv-id", rdzv_id, "--rdzv-conf", "read_timeout=2"],
        tool_name="elastic-ctl",
    )
    assert anonymous.returncode == 2 and "refused the credentials" in anonymous.stderr  # configuration: no retry


def test_the_lighthouse_replica_beside_an_agent_reaches_etcd_with_the_agents_credentials(
    auth_etcd, password_file, tmp_path
):
    """--lighthouse: the replica is handed the agent's etcd target (user and password) in a file only
    the agent's user can read; nothing of it on a command line. Its worker sees its address."""
    pytest.importorskip("torchft")
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD_FILE": password_file}
    out = tmp_path / "out"
    out.mkdir()
    args = agent_args(auth_etcd, run_id(), "1", nproc=1) + ["--lighthouse", run_id(), "--lighthouse-port", "0"]
    agent = start([*args, PROBE, str(out), "--run", "1"], env=env)
    try:
        wait_for(lambda: records(str(out), 0) or agent.poll() is not None, 60, what="the worker")
        shown = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        code, output = finish(agent, timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert code == 0, output
    assert "torchft lighthouse" in output and "a replica at" in output, output
    (record,) = records(str(out), 0).values()
    assert record["env"]["TORCHFT_LIGHTHOUSE"].startswith("http://"), record["env"]
    assert PASSWORD not in shown and PASSWORD not in output


def test_the_conf_wins_over_the_environment(auth_etcd, password_file):
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD": "wrong-pw-from-env"}
    result = run(
        [
            "status",
            "--rdzv-endpoint",
            auth_etcd,
            "--rdzv-id",
            "none-such",
            "--rdzv-conf",
            f"user=trainer,password={PASSWORD}",
        ],
        env=env,
        tool_name="elastic-ctl",
    )
    assert result.returncode == 1 and "no job 'none-such'" in result.stderr, result.stderr


def test_a_wrong_password_is_one_line_and_exit_2_and_is_not_echoed(auth_etcd, tmp_path):
    wrong = "Wr0ng-pw-xyz"
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD": wrong}
    result = run(
        agent_args(auth_etcd, run_id(), "1", nproc=1, conf="connect_timeout=2") + [PROBE, str(tmp_path)], env=env
    )
    assert result.returncode == 2, result.stderr  # the exit-code table: configuration, not worth a retry
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refused the credentials" in lines[0], lines
    assert wrong not in result.stderr + result.stdout and "Traceback" not in result.stderr


def test_a_password_file_that_cannot_be_read_is_a_usage_error(auth_etcd, tmp_path):
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD_FILE": str(tmp_path / "missing")}
    result = run(agent_args(auth_etcd, run_id(), "1", nproc=1) + [PROBE, str(tmp_path)], env=env)
    assert (
        result.returncode == 2 and "ELASTIC_ETCD_PASSWORD_FILE=" in result.stderr and "cannot be read" in result.stderr
    )


def test_the_library_view_takes_credentials_from_the_environment(auth_etcd, monkeypatch):
    import elastic

    monkeypatch.setenv("ELASTIC_ETCD_USER", "trainer")
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", PASSWORD)
    assert elastic.get_state(auth_etcd, "no-job-here") is None  # read with the role's rights, no error
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "wrong")
    with pytest.raises(RendezvousCredentialsError, match="refused the credentials"):
        elastic.get_state(auth_etcd, "no-job-here")


def test_credentials_against_an_etcd_without_auth_are_one_line_and_exit_2(etcd_endpoints, tmp_path):
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD": PASSWORD}
    result = run(agent_args(etcd_endpoints, run_id(), "1", nproc=1) + [PROBE, str(tmp_path)], env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "does not use authentication, but a user was given (ELASTIC_ETCD_USER or --rdzv-conf user=)" in lines[0]
    assert PASSWORD not in result.stderr


def test_a_user_without_permission_on_the_prefix_is_told_which_permission_and_prefix(
    auth_etcd, password_file, tmp_path
):
    """The role may use /elastic/ only: a job under another key prefix is refused, and the line says
    what to grant, not that the credentials were wrong."""
    env = {"ELASTIC_ETCD_USER": "trainer", "ELASTIC_ETCD_PASSWORD_FILE": password_file}
    conf = "key_prefix=/other,connect_timeout=5"
    result = run(agent_args(auth_etcd, run_id(), "1", nproc=1, conf=conf) + [PROBE, str(tmp_path)], env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "let user 'trainer' in, but its roles may not read '/other/" in lines[0], lines[0]
    assert "etcdctl role grant-permission <role> --prefix=true readwrite /other/" in lines[0], lines[0]
    assert "refused the credentials" not in lines[0]
