"""``--logs-specs NAME``: a torch ``LogsSpecs`` class from the ``torchrun.logs_specs`` entry points,
as a layout strategy.

``default`` (or no option) is elastic-run's own layout (``launcher.output.default``), which follows
torch's DefaultLogsSpecs without importing torch. Any other name is looked up as torchrun looks it
up, built with torchrun's arguments (``log_dir``, ``redirects``, ``tee``, ``local_ranks_filter``),
and asked each attempt for its ``reify(envs)``: where each local rank's stdout and stderr go (""
is the console, a path a file), which of them are tailed to the console, and the error files.
torch is imported only on that path: such a class is a subclass of torch's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from launcher import envnames
from launcher.errors import UsageError

from .streams import Layout, RankLogs, StreamPlan, line_prefix

__all__ = ["GROUP", "load_logs_specs", "TorchLogsSpecsLayout"]

GROUP = "torchrun.logs_specs"


def load_logs_specs(name: str | None, log_dir: str | None, redirects: Any, tee: Any, ranks_filter: Any) -> Any:
    """None for ``default``; else an instance of the class the entry point names (wrap it in a
    ``TorchLogsSpecsLayout``)."""
    if name is None or name == "default":
        return None
    from importlib.metadata import entry_points  # only here: it costs every agent start ~20 ms otherwise

    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        known = ", ".join(sorted({"default", *found})) or "default"
        raise UsageError(f"--logs-specs {name!r}: no such entry point in group {GROUP} (known: {known})")
    try:
        cls = found[name].load()
        from torch.distributed.elastic.multiprocessing.api import Std

        def std(value: Any) -> Any:
            if isinstance(value, dict):
                return {rank: Std(level) for rank, level in value.items()}
            return Std(value)

        return cls(
            log_dir=log_dir,
            redirects=std(redirects),
            tee=std(tee),
            local_ranks_filter=set(ranks_filter) if ranks_filter else None,
        )
    except UsageError:
        raise
    except Exception as exc:  # a third party's class: name it and what it said, in one line
        raise UsageError(f"--logs-specs {name!r} could not be loaded: {type(exc).__name__}: {exc}") from None


def _plan(target: str, tailed: dict[int, str], rank: int) -> StreamPlan:
    file = target if target not in ("", os.devnull) else None
    teed = rank in tailed and tailed[rank] != os.devnull
    return StreamPlan(console=target == "" or teed, prefixed=teed, file=file)


@dataclass(frozen=True)
class TorchLogsSpecsLayout:
    """A torch ``LogsSpecs`` instance, asked each attempt where each local rank's output goes."""

    specs: Any  # the LogsSpecs instance
    prefix_template: str | None = None  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()

    def layout(self, attempt: int, *, role: str, base_rank: int, nproc: int, run_id: str, restart_count: int) -> Layout:
        envs = {r: {envnames.RUN_ID: run_id, envnames.RESTART_COUNT: str(attempt)} for r in range(nproc)}
        try:
            dest = self.specs.reify(envs)
        except Exception as exc:  # a third party's class: one line naming it, never a traceback
            raise UsageError(
                f"--logs-specs {type(self.specs).__name__}.reify failed: {type(exc).__name__}: {exc}"
            ) from None
        ranks = {}
        for r in range(nproc):
            error_file = dest.error_files.get(r) or envs[r].get(envnames.ERROR_FILE) or os.devnull
            ranks[r] = RankLogs(
                _plan(dest.stdouts.get(r, ""), dest.tee_stdouts, r),
                _plan(dest.stderrs.get(r, ""), dest.tee_stderrs, r),
                error_file,
                line_prefix(self.prefix_template, role, base_rank + r, r),
            )
        filtered_out = getattr(dest, "filtered_stdout", None) if self.stdout_filters else None
        filtered_err = getattr(dest, "filtered_stderr", None) if self.stderr_filters else None
        return Layout(ranks, filtered_out, filtered_err, self.stdout_filters, self.stderr_filters)
