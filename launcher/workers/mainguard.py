"""A launch script's guard: a function entrypoint of the launch script reaches its workers by their
importing that script (multiprocessing's spawn preparation), so a launch the script makes when it is
imported -- not under ``if __name__ == "__main__":`` -- would run again in every worker. Said in one
line before any worker starts; a worker that launches while it imports the script is stopped too."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["unguarded_launch", "guarded_lines", "PREPARING"]

PREPARING = "ELASTIC_FN_WORKER_PREPARING"  # set in a function worker while it imports the launch script


def unguarded_launch(entrypoint: Callable[..., Any] | str) -> str | None:
    """Why launching ``entrypoint`` from here cannot work, or None: a function of the launch script
    reaches its workers by their importing that script, so a launch the script makes when it is
    imported (not under ``if __name__ == "__main__":``) would run again in every worker."""
    if os.environ.get(PREPARING):
        return (
            'a worker imported the launch script and it launched again: put the launch under if __name__ == "__main__":'
        )
    if isinstance(entrypoint, str) or getattr(entrypoint, "__module__", None) != "__main__":
        return None
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    line = _main_call_line()
    if not path or line is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            guarded = guarded_lines(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    if line in guarded:
        return None
    name = getattr(entrypoint, "__name__", "the entrypoint")
    return (
        f"{os.path.basename(path)} launches at line {line} when it is imported, and every worker imports it to "
        f'find {name}(): put the launch under if __name__ == "__main__":'
    )


def guarded_lines(source: str) -> set[int]:
    """Pure: the line numbers of ``source`` inside an ``if __name__ == "__main__":`` block."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def _main_call_line() -> int | None:
    """The line of the launch script's module-level code that led to this launch (None: not from there)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return frame.f_lineno
        frame = frame.f_back
    return None
