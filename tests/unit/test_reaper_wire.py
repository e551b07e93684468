"""The agent <-> reaper wire: every message reads back as itself, a bad line is none, and the reaper
program -- run by path with ``python -I -S``, as the agent runs it -- loads the same wire and acts on
what the agent's handle writes (a fence deadline that passes kills a registered group and says so)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from launcher.reaper import wire
from launcher.reaper.handle import _REAPER

MESSAGES = [
    wire.Started(4242), wire.Stopped(4242), wire.Deadline(123.456789), wire.Deadline(None), wire.Lease(7587),
    wire.Lease(0), wire.Round(3), wire.Temporary("/tmp/elastic-x"), wire.Temporary(""), wire.Fenced(99.5),
    wire.Config('{"endpoints": ["127.0.0.1:2379"]}', ("/a", "/b"), {"prefix": "/elastic", "node": "n1"}),
    wire.Config("{}", (), None),
]  # fmt: skip


@pytest.mark.parametrize("message", MESSAGES, ids=[type(m).__name__ for m in MESSAGES])
def test_every_message_reads_back_as_itself(message):
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode(line.decode().rstrip("\n")) == message


@pytest.mark.parametrize(
    "line",
    ["", "+", "+x", "-1.5", "Lnope", "R-1", "Dsoon", "F", "Fnever", "C", "C[1]", 'C{"target": 1}',
     'C{"target": "t", "sys_path": "/a"}', 'C{"target": "t", "history": {"node": "n"}}', "X12", "?"],
)  # fmt: skip
def test_a_line_that_is_no_message_is_none(line):
    assert wire.decode(line) is None


def test_the_reaper_run_by_path_fences_a_group_whose_deadline_passes():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    reaper = subprocess.Popen(
        [sys.executable, "-I", "-S", _REAPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 0.5
        reaper.stdin.write(wire.encode(wire.Started(victim.pid)) + wire.encode(wire.Deadline(deadline)))
        reaper.stdin.flush()
        ready, _, _ = select.select([reaper.stdout], [], [], 10)
        assert ready, "the reaper said nothing within 10 s of a deadline 0.5 s away"
        said = wire.decode(os.read(reaper.stdout.fileno(), 4096).decode().splitlines()[0])
        assert said == wire.Fenced(deadline)  # the deadline it acted on, to the digit
        assert victim.wait(10) == -9
    finally:
        victim.kill()
        reaper.stdin.close()
        assert reaper.wait(10) == 0  # EOF: the agent is gone, the reaper ends
