"""The warm interpreter started at the command's first line, before the agent's own imports.

An agent spends about 0.6 s importing itself (gRPC, etcd's client, click) and connecting before it
starts the interpreter its workers are forked from, and that interpreter's imports (torch, and the
torch._dynamo its optimizers load: 2-5 s) are what the first step waits for. Started from the
command line as it was typed, the two overlap. The line is read here with the option table alone
(no parsing, no checks): when it is anything but plain -- an abbreviated or unknown option, a
program that is not a Python file or module, a wrapped worker (--numa-binding), --run-path,
--no-python, --no-warm-start -- nothing starts early, and the agent starts its interpreter as
before. The agent adopts this one only if it asks for the same imports in the same environment
(``launcher.warmstart.warm_starter``); otherwise it is stopped, and a new one started.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from launcher.optable import OPTIONS
from launcher.warmstart.interpreter import WarmStarter, early_warm_starter

__all__ = ["start_early_warm"]

_OFF = ("no_python", "run_path", "numa_binding")  # options under which no worker is forked warm as typed


def start_early_warm(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> WarmStarter | None:
    """The warm interpreter for ``elastic-run ARGV``'s workers, started now; None when the line is not
    plain enough to tell what it would import (the agent then decides, as always)."""
    scanned = _scan(argv)
    if scanned is None:
        return None
    given, script, args = scanned

    def value(key: str, default: object = None) -> object:
        return given.get(key, environ.get(f"PET_{key.upper()}", default))

    if any(value(key) for key in _OFF) or "PET_WARM_START" in environ or given.get("warm_start") is False:
        return None
    if value("module"):
        program = [sys.executable, "-u", "-m", script, *args]
    elif os.path.isfile(script):
        program = [sys.executable, "-u", script, *args]
    else:
        return None
    nproc = str(value("nproc_per_node", "1")).strip().lower()
    many = not nproc.isdigit() or int(nproc) > 1  # cpu, gpu, auto: most likely several
    preload = tuple(item for item in str(value("preload", "")).split(",") if item)
    try:
        return early_warm_starter(program, preload, many, environ)
    except OSError:
        return None  # the agent tries again, and says why if it fails


def _scan(argv: Sequence[str]) -> tuple[dict[str, object], str, list[str]] | None:
    """(option key -> value, True/False for a flag), the script and its arguments; None when a token
    is not one of the table's exact spellings or no script follows."""
    spellings = {}
    for option in OPTIONS:
        for spelling in option.spellings:
            spellings[spelling] = (option, True)
        if option.off:
            spellings[option.off] = (option, False)
    given: dict[str, object] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            i += 1
            break
        if not token.startswith("-") or token == "-":
            break
        name, eq, text = token.partition("=")
        if name not in spellings:
            return None
        option, on = spellings[name]
        if option.flag:
            if eq:
                return None
            given[option.key] = on
            i += 1
            continue
        if not eq:
            if i + 1 >= len(tokens):
                return None
            text, i = tokens[i + 1], i + 1
        given[option.key] = text
        i += 1
    if i >= len(tokens):
        return None
    return given, tokens[i], tokens[i + 1 :]
