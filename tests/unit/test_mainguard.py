"""The launch script's guard, read from its source (pure)."""

from __future__ import annotations

from launcher.workers.mainguard import PREPARING, guarded_lines, unguarded_launch

SOURCE = """import x

def train():
    return 1

if __name__ == "__main__":
    launch(
        train,
    )
elif "__main__" == __name__:
    pass
if "__main__" == __name__:
    other()
launch(train)
"""


def test_the_lines_under_a_main_guard_are_found_in_either_order():
    lines = guarded_lines(SOURCE)
    assert {7, 8, 9} <= lines and 13 in lines
    assert not {1, 3, 4, 6, 14} & lines


def test_a_worker_that_launches_while_importing_the_script_is_stopped(monkeypatch):
    monkeypatch.setenv(PREPARING, "1")
    assert "launched again: put the launch under" in unguarded_launch("python")
    monkeypatch.delenv(PREPARING)
    assert unguarded_launch("python") is None  # a command entrypoint needs no import of the script
