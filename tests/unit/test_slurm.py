"""SLURM's defaults, decided from the environment alone (pure)."""

from __future__ import annotations

from launcher.slurm.defaults import slurm_defaults
from launcher.slurm.job import PORT_BASE, SlurmJob, etcd_layout, member_count, slurm_job

STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURMD_NODENAME": "n2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_JOB_NODELIST": "n[1-4]",
    "SLURM_RESTART_COUNT": "1",
}


def test_a_task_of_a_step_is_a_slurm_job_and_a_batch_script_or_a_plain_shell_is_not():
    assert slurm_job(STEP) == SlurmJob("4242", 4, "n2", 1, "n[1-4]", 1)
    assert slurm_job(STEP).rdzv_id == "slurm-4242"
    assert slurm_job({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}) is None  # the batch script itself
    assert slurm_job({}) is None
    assert slurm_job({**STEP, "SLURM_NODEID": "x"}) is None


def test_one_member_for_one_or_two_nodes_else_three_on_the_first_nodes_at_ports_of_the_job():
    assert [member_count(n) for n in (1, 2, 3, 64)] == [1, 1, 3, 3]
    hosts = [("n1", "10.0.0.1"), ("n2", "10.0.0.2"), ("n3", "10.0.0.2"), ("n4", "10.0.0.4")]
    layout = etcd_layout(slurm_job(STEP), hosts)
    base = PORT_BASE + 6 * (4242 % 2000)
    assert layout.endpoints == f"10.0.0.1:{base},10.0.0.2:{base + 2},10.0.0.2:{base + 4}"  # n2 and n3 share a host
    assert layout.initial_cluster == (
        f"m0=http://10.0.0.1:{base + 1},m1=http://10.0.0.2:{base + 3},m2=http://10.0.0.2:{base + 5}"
    )
    assert layout.mine.name == "m1" and etcd_layout(slurm_job({**STEP, "SLURMD_NODENAME": "n4"}), hosts).mine is None
    other = etcd_layout(slurm_job({**STEP, "SLURM_JOB_ID": "4243"}), hosts)
    assert not {m.client_port for m in other.members} & {m.client_port for m in layout.members}
    assert max(m.peer_port for m in etcd_layout(slurm_job({**STEP, "SLURM_JOB_ID": "1999"}), hosts).members) < 32768


def test_the_options_given_win_and_nothing_changes_outside_slurm(monkeypatch):
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    given = frozenset({"rdzv_endpoint", "local_addr", "nnodes"})
    changes, plan = slurm_defaults(given, standalone=False)
    assert changes == {"rdzv_id": "slurm-4242"}  # only what was not given
    assert plan.etcd is None and plan.job.node_name == "n2"
    assert slurm_defaults(None, standalone=False) == ({}, None)  # the Python API
    assert slurm_defaults(frozenset(), standalone=True) == ({}, None)
    monkeypatch.delenv("SLURM_STEP_ID")
    assert slurm_defaults(frozenset(), standalone=False) == ({}, None)


def test_a_member_listens_on_its_ip_or_on_every_interface_for_a_name_and_is_advertised_by_its_address():
    from launcher.slurm.allocation import member_command

    hosts = [("n1", "10.0.0.1"), ("n2", "node02"), ("n3", "10.0.0.3")]
    layout = etcd_layout(slurm_job({**STEP, "SLURMD_NODENAME": "n2"}), hosts)
    command = member_command("etcd", layout, layout.mine, "/tmp/d")
    flags = dict(zip(command[1::2], command[2::2]))
    port = layout.mine.client_port
    assert flags["--listen-client-urls"] == f"http://0.0.0.0:{port}"  # a name: every interface
    assert flags["--advertise-client-urls"] == f"http://node02:{port}"
    assert flags["--initial-cluster"] == layout.initial_cluster and flags["--name"] == "m1"
    assert "--auto-compaction-retention=5m" in command and "--quota-backend-bytes=2147483648" in command
    first = etcd_layout(slurm_job({**STEP, "SLURMD_NODENAME": "n1"}), hosts)
    assert f"http://10.0.0.1:{first.mine.client_port}" in member_command("etcd", first, first.mine, "/tmp/d")
