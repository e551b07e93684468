import json
from dataclasses import replace

import pytest

from rendezvous.errors import RendezvousSettingsError, RendezvousStateError
from rendezvous.job.state import CAUSE_NAMES, CLOSED_BY_OPERATOR, Cause, JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode, frozen_state
from rendezvous.settings import RendezvousSettings, parse_conf


def _state():
    return JobState(
        "job",
        2,
        JobStatus.RUNNING,
        1,
        3,
        "h",
        29500,
        None,
        "",
        table="2-abc",
        size=2,
        world=6,
        buckets=1,
        cause=Cause(("rank 1 on node b failed (exit code 1)",), ("c",), (), 2),
    )


def test_job_state_round_trips_through_json():
    state = _state()
    assert JobState.decode(state.encode()) == state
    assert state.world == 6
    assert state.as_dict()["status"] == "running"
    assert state.as_dict()["cause"] == {
        "failures": ["rank 1 on node b failed (exit code 1)"],
        "lost": ["c"],
        "joining": [],
        "waiting": 2,
    }


def _frozen(k: int) -> JobState:
    participants = tuple(
        Participant(f"node-{i:05d}-{i * 7919 % 16**8:08x}", i, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 8)
        for i in range(k)
    )
    nodes = [LiveNode(NodeInfo(p.node, 3, p.addr, 8, 29500), i) for i, p in enumerate(participants)]
    return frozen_state("job-42", 3, participants, nodes, k // 2, k, restarts=1, max_restarts=3, table="3-0123abcd")


def test_the_state_every_node_reads_is_the_same_size_at_16_and_at_16384_nodes():
    small, big = _frozen(16), _frozen(16384)
    assert (big.size, big.world, big.buckets) == (16384, 16384 * 8, 512)
    assert len(big.encode()) - len(small.encode()) <= 16  # a few more digits in five counts, no participant
    decoded = JobState.decode(big.encode())
    assert decoded.participants == () and decoded.world == 16384 * 8


def test_a_cause_keeps_a_few_names_however_many_nodes_went():
    cause = Cause.of([], [f"n{i}" for i in range(4096)], [], 0)
    assert len(cause.lost) == CAUSE_NAMES


def test_node_info_round_trips_through_json():
    info = NodeInfo("n", 3, "10.0.0.1", 8, 29500)
    assert NodeInfo.decode(info.encode()) == info


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"\x80\x04garbage", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"schema": 99}', "schema version 99"),
        (b'{"round": 1}', "schema version None"),
    ],
)
def test_decode_refuses_what_is_not_a_job_state(raw, fragment):
    with pytest.raises(RendezvousStateError, match=fragment):
        JobState.decode(raw)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"round": "2"}, "'round' is not int"),
        ({"status": "dancing"}, "malformed"),
        ({"size": 2, "buckets": 0}, "do not agree"),
        ({"world": -1}, "do not agree"),
        ({"table": 7}, "'table' is not str"),
        ({"cause": {"lost": "a"}}, "cause.lost is not a list of strings"),
        ({"cause": {"waiting": "2"}}, "cause.waiting is not int"),
        ({"cause": []}, "'cause' is not dict"),
        ({"max_nodes": True}, "'max_nodes' is not int"),
    ],
)
def test_decode_names_the_malformed_field(change, fragment):
    data = json.loads(_state().encode())
    data.update(change)
    with pytest.raises(RendezvousStateError, match=fragment):
        JobState.decode(json.dumps(data).encode())


def test_settings_from_conf_use_torch_key_names():
    settings = RendezvousSettings.from_conf(
        "job", 2, 4, "join_timeout=10,last_call_timeout=0.5,read_timeout=3,lease_ttl=4,key_prefix=/x"
    )
    assert (settings.join_timeout, settings.last_call_timeout, settings.read_timeout) == (10.0, 0.5, 3.0)
    assert (settings.lease_ttl, settings.key_prefix, settings.min_nodes, settings.max_nodes) == (4, "/x", 2, 4)


@pytest.mark.parametrize(
    "min_nodes, max_nodes, conf, fragment",
    [
        (3, 2, "", "max_nodes"),
        (0, 2, "", "min_nodes"),
        (1, 1, "bogus=1", "unknown --rdzv-conf key 'bogus'"),
        (1, 1, "join_timeout=abc", "join_timeout='abc'"),
        (1, 1, "join_timeout=-1", "join_timeout must be a positive"),
        (1, 1, "join_timeout=nan", "join_timeout must be a positive"),
        (1, 1, "lease_ttl=1", "lease_ttl"),
        (1, 1, "novalue", "not key=value"),
        (1, 1, "protocol=grpc", "protocol"),
    ],
)
def test_bad_settings_name_what_is_wrong(min_nodes, max_nodes, conf, fragment):
    with pytest.raises(RendezvousSettingsError, match=fragment):
        RendezvousSettings.from_conf("job", min_nodes, max_nodes, conf)


def test_parse_conf_skips_empty_entries():
    assert parse_conf(" a=1, ,b = 2 ") == {"a": "1", "b": "2"}


def test_credentials_come_from_the_environment_and_the_conf_wins():
    environ = {"ELASTIC_ETCD_USER": "env-user", "ELASTIC_ETCD_PASSWORD": "env-pw", "ELASTIC_ETCD_CACERT": "/ca.pem"}
    settings = RendezvousSettings.from_conf("job", 1, 1, "", environ=environ)
    assert (settings.user, settings.password, settings.ca_cert) == ("env-user", "env-pw", "/ca.pem")
    settings = RendezvousSettings.from_conf("job", 1, 1, "user=conf-user,password=conf-pw", environ=environ)
    assert (settings.user, settings.password) == ("conf-user", "conf-pw")
    assert "conf-pw" not in repr(settings) and "env-pw" not in repr(settings)


def test_both_password_variables_at_once_are_refused(tmp_path):
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    environ = {"ELASTIC_ETCD_PASSWORD_FILE": str(path)}
    assert RendezvousSettings.from_conf("job", 1, 1, "", environ=environ).password == "from-file"
    with pytest.raises(RendezvousSettingsError, match="not both"):
        RendezvousSettings.from_conf("job", 1, 1, "", environ={**environ, "ELASTIC_ETCD_PASSWORD": "x"})


def test_workers_never_get_the_credential_variables():
    from launcher.workers.env import WorkerSpec, worker_env

    spec = WorkerSpec(
        local_rank=0,
        local_world_size=1,
        base_global_rank=0,
        world_size=1,
        group_rank=0,
        group_world_size=1,
        master_addr="h",
        master_port=1,
        run_id="job",
        restart_count=0,
        max_restarts=0,
        role="default",
        error_file="/tmp/e.json",
    )
    env = worker_env(
        spec,
        {"ELASTIC_ETCD_PASSWORD": "pw", "ELASTIC_ETCD_PASSWORD_FILE": "/pw", "ELASTIC_ETCD_KEY": "/k", "HOME": "/root"},
    )
    assert not [name for name in env if name.startswith("ELASTIC_ETCD_")] and env["HOME"] == "/root"


def test_torchs_conf_keys_and_its_quoted_form_are_accepted():
    conf = "'join_timeout=5,last_call_timeout=1,timeout=7,etcd_prefix=/t,ssl_cert=/c.pem,heartbeat=9,is_host=1,rank=0'"
    settings = RendezvousSettings.from_conf("job", 1, 2, conf, environ={})
    assert (settings.join_timeout, settings.last_call_timeout, settings.key_prefix, settings.cert_cert) == (
        7.0,
        1.0,
        "/t",
        "/c.pem",
    )
    assert parse_conf('"a=1,b=2"') == {"a": "1", "b": "2"}


def test_an_unknown_key_is_an_error_for_the_library_and_one_warning_for_the_cli():
    with pytest.raises(RendezvousSettingsError, match="unknown --rdzv-conf key 'bogus'; known keys: .*timeout"):
        RendezvousSettings.from_conf("job", 1, 1, "bogus=1", environ={})
    said: list[str] = []
    settings = RendezvousSettings.from_conf("job", 1, 1, "bogus=1,zap=2,join_timeout=3", environ={}, warn=said.append)
    assert settings.join_timeout == 3.0
    assert len(said) == 1 and said[0].startswith("ignoring unknown --rdzv-conf keys 'bogus', 'zap'; known keys: ")


def test_a_near_miss_of_a_known_key_is_answered_with_did_you_mean():
    with pytest.raises(RendezvousSettingsError) as caught:
        RendezvousSettings.from_conf("job", 1, 1, "join_timout=5")
    assert str(caught.value) == "unknown --rdzv-conf key 'join_timout' (did you mean 'join_timeout'?)"
    said: list[str] = []
    RendezvousSettings.from_conf("job", 1, 1, "retension=0,bogus=1", warn=said.append)
    assert said[0].startswith(
        "ignoring unknown --rdzv-conf keys 'bogus', 'retension' (did you mean 'retention'?); known"
    )


def test_a_jobs_outcome_names_how_it_ended_and_a_job_no_agent_keeps_is_stopped():
    base = JobState("job", 2, JobStatus.RUNNING, 1, 2)
    assert base.outcome(live_nodes=2) == "running"
    assert replace(base, status=JobStatus.JOINING).outcome(1) == "joining"
    assert base.outcome(live_nodes=0) == "stopped"
    closed = replace(base, status=JobStatus.CLOSED)
    assert closed.outcome(0) == "succeeded"
    assert replace(closed, failed=True).outcome(0) == "failed"
    assert replace(closed, closed_by=CLOSED_BY_OPERATOR).outcome(0) == "closed by an operator"


@pytest.mark.parametrize("run_id", ["..", ".", "a/b", "a\\b", "a\x00b", "a\x1fb", "a\x7fb", "a b", "", "x" * 201])
def test_a_run_id_that_could_name_a_path_or_key_outside_the_jobs_own_is_refused(run_id):
    from rendezvous.job.keys import validate_run_id

    with pytest.raises(RendezvousSettingsError):
        validate_run_id(run_id)


def test_ordinary_run_ids_pass():
    from rendezvous.job.keys import validate_run_id

    for run_id in ("job-42", "a.b_c", "...", "UPPER.lower-09"):
        assert validate_run_id(run_id) == run_id
