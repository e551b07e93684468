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
