"""Real clients from PyPI, launched as their users launch them (docs/clients.md).

- accelerate: the docs' recipe block, run as written with only its values changed (two machine
  ranks on one host, the suite's etcd), then again with the same id -- and on one machine.
- Lightning and the HF Trainer: the same script under torchrun and elastic-run with the same
  arguments (torchrun's single-node line), each rank trained and saw the whole world.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.cli_helpers import tool

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent.parent / "docs" / "clients.md"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _recipe() -> tuple[dict[str, str], list[str]]:
    """The docs' accelerate block: its exported variables and the launch line's arguments."""
    block = re.search(r"```bash\n(export PET_RDZV_ENDPOINT=.*?)```", DOCS.read_text(), re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    exports = {}
    while words[0] == "export":
        name, value = words[1].split("=", 1)
        exports[name], words = value, words[2:]
    assert words[:2] == ["accelerate", "launch"], words
    return exports, words[2:]


def _with(args: list[str], values: dict[str, str]) -> list[str]:
    """``args`` with each option's value replaced (the option must be in them: the docs say it)."""
    out = list(args)
    for option, value in values.items():
        assert option in out, f"docs/clients.md's recipe has no {option}"
        out[out.index(option) + 1] = value
    return out


def _accelerate(args: list[str], env: dict[str, str], marks: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [tool("accelerate"), "launch", *args[:-1], str(HERE / "workers" / "accelerate_train.py"), str(marks)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _ranks(marks: Path) -> list[list[str]]:
    text = (marks / "ranks").read_text() if (marks / "ranks").exists() else ""
    return sorted(line.split() for line in text.splitlines())


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "ACCELERATE_"))}


def test_accelerate_launch_on_two_machines_by_the_docs_recipe_and_again_with_the_same_id(tmp_path, etcd_endpoints):
    pytest.importorskip("accelerate")
    exports, args = _recipe()
    assert set(exports) == {"PET_RDZV_ENDPOINT", "PET_RDZV_ID"} and args[-1] == "train.py", (exports, args)
    job = f"acc-{uuid.uuid4().hex[:8]}"
    env = {**_clean_env(), "PET_RDZV_ENDPOINT": etcd_endpoints, "PET_RDZV_ID": job}
    for run in (1, 2):
        marks = tmp_path / f"run{run}"
        marks.mkdir()
        port = str(_free_port())
        machines = [
            _with(
                args,
                {
                    "--machine_rank": str(rank),
                    "--num_processes": "4",
                    "--main_process_ip": "127.0.0.1",
                    "--main_process_port": port,
                },
            )
            for rank in (0, 1)
        ]
        launched = [_accelerate(machine, env, marks) for machine in machines]
        outputs = [p.communicate(timeout=180)[0] for p in launched]
        assert [p.returncode for p in launched] == [0, 0], "\n".join(o[-3000:] for o in outputs)
        assert _ranks(marks) == [[str(r), "4", job] for r in range(4)], (run, _ranks(marks), outputs[0][-2000:])


def test_accelerate_launch_on_one_machine_with_the_recipes_variables(tmp_path, etcd_endpoints):
    pytest.importorskip("accelerate")
    job = f"acc1-{uuid.uuid4().hex[:8]}"
    env = {**_clean_env(), "PET_RDZV_ENDPOINT": etcd_endpoints, "PET_RDZV_ID": job}
    args = [
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(_free_port()),
        "--rdzv_backend",
        "etcd-v3",
        "train.py",
    ]
    launched = _accelerate(args, env, tmp_path)
    output = launched.communicate(timeout=180)[0]
    assert launched.returncode == 0, output[-3000:]
    assert _ranks(tmp_path) == [["0", "2", job], ["1", "2", job]], output[-2000:]


SIDE_BY_SIDE = ["--standalone", "--nproc-per-node", "2"]


@pytest.mark.parametrize(
    "client, script", [("pytorch_lightning", "lightning_train.py"), ("transformers", "hf_trainer.py")]
)
def test_a_clients_script_trains_the_same_under_torchrun_and_elastic_run(tmp_path, client, script):
    pytest.importorskip(client)
    sides = {"torchrun": TORCHRUN, "elastic-run": [tool("elastic-run")]}
    launched = {}
    for name, launcher in sides.items():
        marks = tmp_path / name
        marks.mkdir()
        argv = [*launcher, *SIDE_BY_SIDE, str(HERE / "workers" / script), str(marks)]
        launched[name] = subprocess.Popen(
            argv, env=_clean_env(), cwd=marks, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for name, process in launched.items():
        output = process.communicate(timeout=180)[0]
        assert process.returncode == 0, f"{name}:\n{output[-3000:]}"
    seen = {name: _ranks(tmp_path / name) for name in sides}
    assert seen["torchrun"] == seen["elastic-run"] == [["0", "2", "4"], ["1", "2", "4"]], seen
