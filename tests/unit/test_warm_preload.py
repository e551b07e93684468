"""What the warm interpreter preloads for a worker's program, read from its source (never run):
torch and numpy where the program imports them, and torch where it saves or loads with
``elastic.checkpoint`` (which imports torch when called)."""

from __future__ import annotations

import sys
from importlib.util import find_spec

import pytest

from launcher.warmstart.interpreter import default_preload

TORCH = ("torch", "torch._dynamo")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import elastic\nstate = elastic.checkpoint.load()\n", TORCH),
        ("from elastic import checkpoint, heartbeat\ncheckpoint.save({}, step=1)\n", TORCH),
        ("import elastic.checkpoint\n", TORCH),
        ("import elastic\nelastic.heartbeat()\n", ()),  # the heartbeat needs no torch
        ("import numpy as np\n", ("numpy", "numpy.random")),
        ("import os\ncheckpoint = None\nos.checkpoint = 1\n", ()),  # another module's attribute of that name
    ],
)
def test_the_preload_follows_what_the_program_imports_and_elastic_checkpoint_brings_torch(tmp_path, source, expected):
    if find_spec("torch") is None or find_spec("numpy") is None:
        pytest.skip("needs torch and numpy installed (the suite's own install has both)")
    script = tmp_path / "train.py"
    script.write_text(source)
    assert default_preload([sys.executable, "-u", str(script)]) == expected
