"""examples/launch_from_python.py, as the README shows it."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_launch_api_example_prints_each_ranks_value_and_runs_a_command():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "launch_from_python.py")],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "{0: 'rank 0 trained with lr=0.1', 1: 'rank 1 trained with lr=0.1'}" in lines, result.stdout
    assert "{0: None, 1: None}" in lines and lines.count("hello") == 2, result.stdout


UNGUARDED = """
from elastic import LaunchConfig, elastic_launch

def train():
    return 1

elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2), train)()
"""


def test_a_launch_script_without_a_main_guard_is_told_what_to_add_before_any_worker_starts(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 1 and "round 1" not in result.stderr, result.stderr  # no agent, no worker ran
    assert result.stderr.splitlines()[-1] == (
        "ValueError: unguarded.py launches at line 7 when it is imported, and every worker imports it to find "
        'train(): put the launch under if __name__ == "__main__":'
    )
    guarded = tmp_path / "guarded.py"
    guarded.write_text(
        UNGUARDED.replace(
            "elastic_launch(LaunchConfig", 'if __name__ == "__main__":\n    print(elastic_launch(LaunchConfig'
        )
        + ")\n"
    )
    result = subprocess.run(
        [sys.executable, str(guarded)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0 and result.stdout.strip() == "{0: 1, 1: 1}", result.stderr
