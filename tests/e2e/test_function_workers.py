"""Functions given to ``elastic_launch`` that the workers cannot import by name -- defined in
``python -`` (as in a notebook or an interactive session), a lambda, a closure -- run on every rank
(sent by value); what cannot be sent at all is refused in one line before any worker starts; and a
worker that cannot load what it was sent says why, not "use @record". Real etcd, real workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

CONFIG = "LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts={restarts}, rdzv_endpoint={ep!r}, run_id={rid!r}, monitor_interval=0.1)"  # noqa: E501


def _launch_from_stdin(source: str, etcd_endpoints: str, restarts: int = 0, timeout: float = 120) -> tuple[dict, str]:
    """``python -`` with ``source`` (a notebook cell's kind of __main__: no file); its RESULT line and stderr."""
    config = CONFIG.format(restarts=restarts, ep=etcd_endpoints, rid=f"fn-{uuid.uuid4().hex[:8]}")
    header = "import json, os, sys\nfrom elastic.launch import LaunchConfig, elastic_launch"
    program = f"{header}\nconfig = {config}\n{source}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE / "workers")])}
    done = subprocess.run(
        [sys.executable, "-"], input=program, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT ") :]), done.stderr


def test_a_function_of_python_stdin_and_an_argument_of_its_class_run_on_every_rank(etcd_endpoints):
    result, _ = _launch_from_stdin(
        """
class Scale:
    def __init__(self, by):
        self.by = by

def train(scale):
    return int(os.environ["RANK"]) * scale.by

print("RESULT " + json.dumps(elastic_launch(config, train)(Scale(10))))
""",
        etcd_endpoints,
    )
    assert result == {"0": 0, "1": 10}


def test_a_lambda_and_a_closure_run_on_every_rank(etcd_endpoints):
    result, _ = _launch_from_stdin(
        """
def make(offset):
    def inner():
        return int(os.environ["RANK"]) + offset
    return inner

first = elastic_launch(config, lambda word: word + os.environ["RANK"])("rank ")
import dataclasses
second = elastic_launch(dataclasses.replace(config, run_id=config.run_id + "-2"), make(100))()
print("RESULT " + json.dumps([first, second]))
""",
        etcd_endpoints,
    )
    assert result == [{"0": "rank 0", "1": "rank 1"}, {"0": 100, "1": 101}]


def _ending(setup: str, call: str, etcd_endpoints: str) -> tuple[str, str]:
    """How ``call`` (after ``setup``) ends in ``python -``: ``succeeded`` or ``Error: message``; and stderr."""
    source = (
        f"{setup}\ntry:\n    {call}\n    print('RESULT ' + json.dumps('succeeded'))\n"
        "except Exception as exc:\n    print('RESULT ' + json.dumps(type(exc).__name__ + ': ' + str(exc)))\n"
    )
    return _launch_from_stdin(source, etcd_endpoints)


def test_what_cannot_be_sent_is_refused_in_one_line_before_any_worker_starts(etcd_endpoints):
    setup = "import threading\nlock = threading.Lock()\ndef holds_the_lock():\n    with lock:\n        return 1\n"
    result, stderr = _ending(setup, "elastic_launch(config, holds_the_lock)()", etcd_endpoints)
    assert result.startswith("UnsendableError: holds_the_lock() cannot be sent to the workers"), result
    assert "lock" in result and "\n" not in result, result
    assert "round 1" not in stderr and "rank" not in stderr, stderr  # no agent, no worker started


def test_a_worker_that_cannot_load_its_function_says_why_not_use_record(etcd_endpoints):
    setup = "from unloadable import Unloadable, echo"
    result, _ = _ending(setup, "elastic_launch(config, echo)(Unloadable())", etcd_endpoints)
    assert result.startswith("ChildFailedError"), result
    assert "this object cannot be loaded in a worker" in result, result
    assert "record" not in result, result


def test_a_failure_names_no_error_file_in_the_removed_log_directory(etcd_endpoints):
    setup = "def fails():\n    raise ValueError('planned failure of rank ' + os.environ['RANK'])\n"
    result, _ = _ending(setup, "elastic_launch(config, fails)()", etcd_endpoints)
    assert "ValueError: planned failure of rank " in result, result  # whichever rank failed first
    assert "error_file: <removed with the run's log directory>" in result, result
    paths = re.findall(r"(/[\w.@-]+(?:/[\w.@-]+)+\.json)", result)
    assert not paths, paths  # torch's field names the file; this one is gone with the temporary log root
