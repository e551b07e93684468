"""The built-in output layout: torch's DefaultLogsSpecs rules, without importing torch.

Files: ``<log dir>/attempt_<n>/<local rank>/{stdout,stderr}.log`` next to the worker's ``error.json``,
and ``attempt_<n>/filtered_{stdout,stderr}.log`` when duplicate filters are set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .streams import STDERR, STDOUT, Layout, RankLogs, Std, attempt_dir, line_prefix, plan_stream

__all__ = ["DefaultLayout"]


@dataclass(frozen=True)
class DefaultLayout:
    """elastic-run's output options for a node, laid out by torch's default rules."""

    root: str  # per-job log directory; attempt_<n>/<local rank>/ under it
    redirects: dict[int, int] | int = Std.NONE
    tee: dict[int, int] | int = Std.NONE
    ranks_filter: frozenset[int] | None = None
    prefix_template: str | None = None  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()

    def layout(self, attempt: int, *, role: str, base_rank: int, nproc: int, run_id: str, restart_count: int) -> Layout:
        """Where each local rank's output goes in this attempt (directories made here)."""
        ranks = {}
        for local_rank in range(nproc):
            directory = attempt_dir(self.root, attempt, local_rank)
            os.makedirs(directory, exist_ok=True)
            plans = [
                plan_stream(
                    local_rank, which, self.redirects, self.tee, self.ranks_filter, os.path.join(directory, name)
                )
                for which, name in ((STDOUT, "stdout.log"), (STDERR, "stderr.log"))
            ]
            ranks[local_rank] = RankLogs(
                plans[0],
                plans[1],
                os.path.join(directory, "error.json"),
                line_prefix(self.prefix_template, role, base_rank + local_rank, local_rank),
            )
        top = os.path.join(self.root, f"attempt_{attempt}")
        return Layout(
            ranks,
            os.path.join(top, "filtered_stdout.log") if self.stdout_filters else None,
            os.path.join(top, "filtered_stderr.log") if self.stderr_filters else None,
            self.stdout_filters,
            self.stderr_filters,
        )
