import pytest

from launcher.workers.env import EXPORTED, WorkerSpec, worker_env


def spec(**changes):
    values = dict(
        local_rank=1,
        local_world_size=2,
        base_global_rank=4,
        world_size=8,
        group_rank=2,
        group_world_size=4,
        master_addr="10.0.0.1",
        master_port=29500,
        run_id="job",
        restart_count=3,
        max_restarts=5,
        error_file="/tmp/err.json",
    )
    values.update(changes)
    return WorkerSpec(**values)


def test_worker_env_exports_what_torchrun_exports():
    env = worker_env(spec(), {"PATH": "/bin"})
    assert {k: env[k] for k in EXPORTED} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/tmp/err.json",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1"
    assert worker_env(spec(agent_store=True), {})["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def test_worker_env_follows_torchruns_omp_and_nccl_rules():
    single = spec(local_rank=0, local_world_size=1, base_global_rank=4)
    assert "OMP_NUM_THREADS" not in worker_env(single, {}), "torchrun sets it only for more than one worker"
    assert worker_env(spec(), {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_worker_env_keeps_the_users_omp_num_threads():
    assert worker_env(spec(), {"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"


def test_worker_env_overrides_stale_launcher_variables_from_the_parent():
    assert worker_env(spec(), {"RANK": "99"})["RANK"] == "5"


@pytest.mark.parametrize("changes", [{"local_rank": 2}, {"base_global_rank": 7}])
def test_worker_env_refuses_a_rank_outside_the_world(changes):
    with pytest.raises(ValueError):
        worker_env(spec(**changes), {})
