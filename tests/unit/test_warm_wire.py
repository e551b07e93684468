"""The agent <-> warm interpreter wire: every message reads back as itself, a message that is none
is refused, and through a real warm interpreter (``zygote.py`` run by path, loading the same wire) a
forked worker's end is told as it was: an exit code, or the signal that killed it."""

from __future__ import annotations

import os
import sys
import time

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


def test_a_worker_forked_as_its_warm_interpreter_dies_ends_at_once_instead_of_running_alone(tmp_path):
    """The agent killed (the warm interpreter dies with it) just as a worker is forked: the child
    gets going only after its parent is gone (here it waits for that), so a parent read in the child
    would already be init, and the parent-death signal, set too late, never comes. ``die_with`` is
    given the interpreter's pid read before the fork: the orphan ends at once, as the worker of a
    dead agent would. A child whose parent lives goes on."""
    import subprocess
    import textwrap

    from launcher.warmstart import zygote

    script = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {os.path.dirname(zygote.__file__)!r})
        import zygote
        parent = os.getpid()
        if os.fork() == 0:
            deadline = time.monotonic() + 10
            while sys.argv[2] == "orphan" and os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.01)  # the parent dies before this child's first step
            zygote.die_with(parent)
            open(sys.argv[1], "w").write("ran on")
            os._exit(0)
        if sys.argv[2] == "orphan":
            os._exit(0)
        os.wait()
        """
    )
    for case in ("orphan", "parent lives"):
        marker = tmp_path / case
        subprocess.run([sys.executable, "-c", script, str(marker), case], timeout=30, check=True)
        deadline = time.monotonic() + 3
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists() is (case == "parent lives"), case
