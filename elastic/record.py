"""``@record``: write a worker's uncaught exception to its TORCHELASTIC_ERROR_FILE (torch's layout)."""

from __future__ import annotations

import functools
import os
from typing import Callable, TypeVar

from launcher.errorfile import write_error

__all__ = ["record"]

F = TypeVar("F", bound=Callable)


def record(fn: F) -> F:
    """Decorate a worker's entry point: an exception escaping it is written to the error file the
    agent named (so the agent's failure summary shows its traceback), then raised on as usual.
    Outside a launched worker (no TORCHELASTIC_ERROR_FILE) it only re-raises.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code in (None, 0):
                raise
            _write(exc)
            raise
        except BaseException as exc:
            _write(exc)
            raise

    return wrapper  # type: ignore[return-value]


def _write(exc: BaseException) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        if os.path.exists(path):
            return  # something more specific (a nested @record) already wrote it
        write_error(exc, path)
    except OSError:
        pass  # never hide the worker's own exception behind a failure to record it
