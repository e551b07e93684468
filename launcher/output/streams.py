"""The output plan of one attempt, as torchrun's: where each worker stream goes, and the options
that say so.

``--redirects`` / ``--tee`` take torchrun's values: 0 (none), 1 (stdout), 2 (stderr), 3 (both), for
every local rank, or per local rank as ``0:1,1:2``. As in torch:

- a stream neither redirected nor teed goes to the console unchanged (the worker writes to the
  agent's own stdout / stderr);
- a redirected stream goes to its log file only;
- a teed stream goes to its log file *and* to the console, whatever ``--redirects`` says, each line
  prefixed ``[<role><local rank>]:`` or by ``--log-line-prefix-template`` (else
  ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``: ``${role_name}``, ``${rank}``, ``${local_rank}``,
  ``${hostname}``);
- ``--local-ranks-filter 0,2`` shows only those local ranks on the console (files unaffected);
- ``--duplicate-stdout-filters a,b`` copies the teed stdout lines that contain ``a`` or ``b``, with
  their prefix, to ``attempt_<n>/filtered_stdout.log`` (one file for all ranks); stderr likewise.

A layout strategy (``LayoutStrategy``) turns the options into each attempt's ``Layout``: the
built-in one (``launcher.output.default``) or a torch ``LogsSpecs`` (``launcher.output.torch_specs``);
the CLI picks one (and parses the options' text: ``launcher.options.values``). Everything here is pure.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from string import Template
from typing import Protocol

__all__ = [
    "STDOUT",
    "STDERR",
    "Std",
    "StreamPlan",
    "plan_stream",
    "line_prefix",
    "RankLogs",
    "Layout",
    "LayoutStrategy",
    "attempt_dir",
]

STDOUT, STDERR = 1, 2  # bit values, as torchrun's Std


class Std:
    NONE, OUT, ERR, ALL = 0, 1, 2, 3


@dataclass(frozen=True)
class StreamPlan:
    console: bool  # shown on the agent's console
    prefixed: bool  # shown with the rank's prefix (a teed stream), else verbatim
    file: str | None  # the log file it is written to


def _level(setting: dict[int, int] | int, local_rank: int) -> int:
    return setting.get(local_rank, Std.NONE) if isinstance(setting, dict) else setting


def plan_stream(
    local_rank: int,
    stream: int,
    redirects: dict[int, int] | int,
    tee: dict[int, int] | int,
    ranks_filter: frozenset[int] | None,
    path: str | None = None,
) -> StreamPlan:
    """Where one worker stream goes (torch's DefaultLogsSpecs). ``stream`` is STDOUT (1) or STDERR (2);
    ``path`` is its log file."""
    redirected = bool(_level(redirects, local_rank) & stream)
    teed = bool(_level(tee, local_rank) & stream)
    shown = ranks_filter is None or local_rank in ranks_filter
    file = path if (redirected or teed) else None
    if teed:
        return StreamPlan(console=shown, prefixed=True, file=file)
    return StreamPlan(console=shown and not redirected, prefixed=False, file=file)


def line_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """The prefix of a teed worker's console lines: torch's ``[<role><local rank>]:``, or the template
    (``${hostname}``: this node's short name, as torch 2.14's agent puts it in)."""
    if template:
        host = socket.gethostname()
        return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank, hostname=host)
    return f"[{role}{local_rank}]:"


@dataclass(frozen=True)
class RankLogs:
    """One worker's output plan for one attempt."""

    stdout: StreamPlan
    stderr: StreamPlan
    error_file: str
    prefix: str


@dataclass(frozen=True)
class Layout:
    """One attempt's output plan: each local rank's, and the duplicate files (None: no filters)."""

    ranks: dict[int, RankLogs]
    filtered_stdout: str | None = None
    filtered_stderr: str | None = None
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()


class LayoutStrategy(Protocol):
    """Where each local rank's output goes in one attempt (the directories are made here)."""

    def layout(
        self, attempt: int, *, role: str, base_rank: int, nproc: int, run_id: str, restart_count: int
    ) -> Layout: ...


def attempt_dir(root: str, attempt: int, local_rank: int) -> str:
    return os.path.join(root, f"attempt_{attempt}", str(local_rank))
