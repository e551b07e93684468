"""What a function worker is handed: the function and its arguments, in a file of the launching
process (never anything read from etcd).

By reference (pickle), as torch's spawn sends them, when every worker can import them: a function
of an importable module, or of the launch script, which each worker re-imports (spawn's preparation
data). By value (cloudpickle: code, defaults, closure and the globals it uses) when it cannot: a
function of ``python -``, ``-c``, a notebook or an interactive session (a ``__main__`` with no file
to re-import), a lambda, a closure, or a class or function nested in another. What cannot be sent
either way is refused here, before any worker starts, in one line naming the function and the fix.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any, BinaryIO

__all__ = ["UnsendableError", "dump_payload", "name_of"]


class UnsendableError(ValueError):
    """The function or its arguments cannot be sent to the workers (one line: what, and the fix)."""


def name_of(entrypoint: Callable[..., Any]) -> str:
    return getattr(entrypoint, "__qualname__", None) or repr(entrypoint)


def dump_payload(handle: BinaryIO, preparation: dict[str, Any], entrypoint: Callable[..., Any], args: tuple) -> None:
    """Write spawn's preparation data, then ``(entrypoint, args)`` by reference or by value."""
    pickle.dump(preparation, handle)
    main_reimported = os.path.isfile(preparation.get("init_main_from_path") or "") or bool(
        preparation.get("init_main_from_name")
    )
    handle.write(_encode(entrypoint, args, main_reimported))


def _encode(entrypoint: Callable[..., Any], args: tuple, main_reimported: bool) -> bytes:
    # Without a main file to re-import, a __main__ object pickled by name would not be found there.
    if main_reimported:
        try:
            return _plain(entrypoint, args)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass  # a lambda, a closure, a nested function: by value
    import cloudpickle

    try:
        return cloudpickle.dumps((entrypoint, args))
    except Exception as exc:  # noqa: BLE001 -- whatever pickling raises is the user's answer, said in one line
        raise UnsendableError(
            f"{name_of(entrypoint)}() cannot be sent to the workers with its arguments: {_first_line(exc)}; "
            "pass only what pickles (no lock, socket, open file or CUDA handle) and make it there"
        ) from None


def _plain(entrypoint: Callable[..., Any], args: tuple) -> bytes:
    """Pickled as torch's spawn does: functions and classes by their module and name."""
    buffer = io.BytesIO()
    pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((entrypoint, args))
    return buffer.getvalue()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
