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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.options.table import OPTIONS
from launcher.options.values import worker_argv

if TYPE_CHECKING:
    from launcher.warmstart.interpreter import WarmStarter

__all__ = ["TypedLine", "read_line", "start_early_warm"]

_OFF = ("no_python", "run_path", "numa_binding")  # options under which no worker is forked warm as typed


@dataclass(frozen=True)
class TypedLine:
    """``elastic-run``'s command line as typed, read once with the option table alone (``read_line``):
    what the command's first moments need of it -- whether to start the local etcd, and the warm
    interpreter -- before click (the parser of record) is even imported."""

    given: Mapping[str, object]  # option key -> its text, or True/False for a flag
    script: str
    args: tuple[str, ...]
    environ: Mapping[str, str]

    def value(self, key: str, default: object = None) -> object:
        """The option's value: as given, else its ``PET_`` variable, else ``default``."""
        return self.given.get(key, self.environ.get(f"PET_{key.upper()}", default))

    @property
    def standalone(self) -> bool:
        return str(self.value("standalone", "")).lower() in ("true", "1", "yes")


def read_line(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> TypedLine | None:
    """``argv`` read with the option table's exact spellings; None when it is not that plain (an
    abbreviation, an unknown option, no script): the CLI then reads it, and decides alone."""
    scanned = _scan(argv)
    return None if scanned is None else TypedLine(scanned[0], scanned[1], tuple(scanned[2]), environ)


def start_early_warm(line: TypedLine | None) -> WarmStarter | None:
    """The warm interpreter for the line's workers, started now; None when the line is not plain
    enough to tell what it would import (the agent then decides, as always)."""
    if line is None:
        return None
    environ, value = line.environ, line.value
    if any(value(key) for key in _OFF) or "PET_WARM_START" in environ or line.given.get("warm_start") is False:
        return None
    try:  # the worker's command as the agent will build it, by the same function
        program = worker_argv(line.script, line.args, module=bool(value("module")))
    except UsageError:
        return None  # the CLI says what is wrong with it
    nproc = str(value("nproc_per_node", "1")).strip().lower()
    many = not nproc.isdigit() or int(nproc) > 1  # cpu, gpu, auto: most likely several
    preload = tuple(item for item in str(value("preload", "")).split(",") if item)
    from launcher.warmstart.interpreter import early_warm_starter

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
