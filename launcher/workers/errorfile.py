"""Worker error files, in the JSON layout torch's ``@record`` writes, so either side reads the other's.

    {"message": {"message": "ValueError: bad",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}

A plain ``{"message": "text", "timestamp": 1700000000}`` (an older layout) is read too.
"""

from __future__ import annotations

import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from launcher import envnames

__all__ = ["ErrorRecord", "write_error", "read_error", "record"]


@dataclass(frozen=True)
class ErrorRecord:
    message: str  # "ValueError: bad"
    traceback: str  # the Python call stack, or "" when the file has none
    timestamp: int  # seconds since the epoch


def write_error(exc: BaseException, path: str) -> None:
    """Record ``exc`` (the exception being handled) at ``path``, atomically."""
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(partial, path)


def read_error(path: str) -> ErrorRecord | None:
    """The record at ``path``; None when there is no file or it is not an error file we understand."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "message" not in data:
        return None
    message = data["message"]
    try:
        if isinstance(message, str):
            return ErrorRecord(message, "", int(data.get("timestamp", 0)))
        if isinstance(message, dict):
            extra = message.get("extraInfo") or {}
            return ErrorRecord(
                str(message.get("message", "")), str(extra.get("py_callstack", "")), int(extra.get("timestamp", 0))
            )
    except (TypeError, ValueError):
        return None
    return None


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
    path = os.environ.get(envnames.ERROR_FILE)
    if not path:
        return
    try:
        if os.path.exists(path):
            return  # something more specific (a nested @record) already wrote it
        write_error(exc, path)
    except OSError:
        pass  # never hide the worker's own exception behind a failure to record it
