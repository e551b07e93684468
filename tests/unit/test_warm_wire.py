"""The agent <-> warm interpreter wire: every message reads back as itself, a message that is none
is refused, and through a real warm interpreter (``zygote.py`` run by path, loading the same wire) a
forked worker's end is told as it was: an exit code, or the signal that killed it."""

from __future__ import annotations

import os
import sys

import pytest

from launcher.warmstart import wire
from launcher.warmstart.interpreter import WarmStarter

MESSAGES = [
    wire.Request(["python3", "-u", "train.py", "--steps", "3"], {"RANK": "0"}, "/work"),
    wire.Ready(["json", "numpy"], {"torch": "ModuleNotFoundError: No module named 'torch'"}, ""),
    wire.Ready([], {}, "the preloaded modules initialized CUDA"),
    wire.Forked(4242),
    wire.Exited(4242, 9),
    wire.Priority(19),
    wire.Priority(-5),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_reads_back_as_itself(message):
    data = wire.encode(message)
    to_interpreter = isinstance(message, (wire.Request, wire.Priority))
    read = wire.to_interpreter(data) if to_interpreter else wire.to_agent(data)
    assert read == message


@pytest.mark.parametrize(
    "data, reader",
    [(b"", wire.to_agent), (b"[]", wire.to_agent), (b'{"pid": 3}', wire.to_agent),  # the old, kind-less form
     (b'{"kind": "forked"}', wire.to_agent), (b'{"kind": "forked", "pid": "3"}', wire.to_agent),
     (b'{"kind": "forked", "pid": true}', wire.to_agent), (b'{"kind": "exited", "pid": 3}', wire.to_agent),
     (b'{"kind": "ready", "loaded": "torch"}', wire.to_agent), (b'{"kind": "request"}', wire.to_agent),
     (b'{"kind": "forked", "pid": 3}', wire.to_interpreter),
     (b'{"kind": "request", "argv": [], "env": {}, "cwd": "/"}', wire.to_interpreter),
     (b'{"kind": "request", "argv": ["x"], "env": {"A": 1}, "cwd": "/"}', wire.to_interpreter),
     (b'{"kind": "request", "argv": ["x"], "env": {}, "cwd": "/", "more": 1}', wire.to_interpreter),
     (b'{"kind": "priority", "nice": 20}', wire.to_interpreter), (b'{"kind": "priority", "nice": "19"}',
     wire.to_interpreter), (b'{"kind": "priority", "nice": true}', wire.to_interpreter),
     (b'{"kind": "priority", "nice": 19}', wire.to_agent)],
)  # fmt: skip
def test_a_message_that_is_none_for_its_reader_is_refused(data, reader):
    assert reader(data) is None


@pytest.mark.parametrize(
    "code, expected",
    [("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15),
     ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9), ("pass", 0)],
    ids=["exit 3", "SIGTERM", "SIGKILL", "exit 0"],
)  # fmt: skip
def test_a_forked_workers_end_is_told_as_it_was(tmp_path, code, expected):
    said: list[str] = []
    starter = WarmStarter(["json"], dict(os.environ), said.append)
    try:
        assert starter.can_start(), said
        with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
            worker = starter.spawn([sys.executable, "-u", "-c", code], dict(os.environ), out.fileno(), err.fileno())
        assert worker.wait(timeout=20) == expected, (tmp_path / "err").read_text()
    finally:
        starter.close()
