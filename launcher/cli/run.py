"""``elastic-run`` (torchrun's options, on etcd v3) and ``elastic-ctl`` (look at a job).

Every option also reads torchrun's ``PET_<NAME>`` environment variable. Bad input ends with one
line on stderr naming what was wrong and exit code 2; see launcher/errors.py for the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from launcher.launch import launch
from launcher.options.values import expand_abbreviations
from launcher.output.console import console_closed, say, set_log_format

from .clickopts import click_options
from .entry import entry, last_line
from .helpfmt import COMPLETION_SHELLS, GroupedCommand, print_completion, rdzv_conf_help
from .parse import RunOptions, plan_from

__all__ = ["elastic_run", "entry", "run_main", "ctl_main"]

_CONTEXT = {"help_option_names": ["-h", "--help"], "allow_interspersed_args": False, "max_content_width": 80}


@click.command("elastic-run", cls=GroupedCommand, context_settings=_CONTEXT)
@click.version_option(package_name="etcd-elastic", prog_name="elastic-run", message="%(prog)s %(version)s")
@click.option(
    "--help-rdzv-conf",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=rdzv_conf_help,
    help="List the --rdzv-conf keys, and exit.",
)
@click.option(
    "--print-completion",
    "--print_completion",
    type=click.Choice(COMPLETION_SHELLS),
    expose_value=False,
    is_eager=True,
    callback=print_completion,
    help="Print a completion script for bash, zsh or fish, and exit.",
)
@click_options()
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def elastic_run(early: _Early | None, log_format: str, **opts: Any) -> int:
    """Launch SCRIPT on this node as one agent of an elastic job (torchrun's options)."""
    set_log_format(log_format)
    ctx = click.get_current_context()
    given = frozenset(name for name in opts if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT))
    plan = replace(plan_from(RunOptions(**opts, given=given)), started=_process_started())
    if early is None:
        return launch(plan).exit_code
    return launch(plan, early_etcd=early.take(), early_warm=early.take_warm()).exit_code


def _process_started() -> float:
    """When this process started (epoch s): its age from the kernel's clock since boot, in ticks
    (/proc; psutil's start time rounds the boot time to a second); where there is none, now."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(age, 0.0)


# -- entry points: one line per error, distinct exit codes, never a traceback ----------------------
def _spellings(command: click.Command) -> tuple[dict[str, str], set[str]]:
    """Every option spelling of ``command`` -> its parameter name; and the spellings that take a value."""
    names: dict[str, str] = {"--help": "help", "-h": "help"}
    takes_value: set[str] = set()
    for param in command.params:
        if isinstance(param, click.Option):
            for spelling in param.opts:
                names[spelling] = param.name or spelling
                if not param.is_flag:
                    takes_value.add(spelling)
    return names, takes_value


def _said(line: str, code: int) -> None:
    """elastic-run's last line: as the agent says it (a JSON object under --log-format json), with the
    exit code and whether a retry may help."""
    say(last_line(line, code), level="error")


class _Early:
    """What ``launcher.cli.main`` started before the heavy imports: an etcd for --standalone, the
    workers' warm interpreter (``launcher.cli.early``). The launch takes them, or they are stopped
    when the command ends without one (bad input, not standalone)."""

    def __init__(self, etcd: Any, warm: Any = None) -> None:
        self._etcd = etcd
        self._warm = warm

    def take(self) -> Any:
        etcd, self._etcd = self._etcd, None
        return etcd

    def take_warm(self) -> Any:
        warm, self._warm = self._warm, None
        return warm

    def stop(self) -> None:
        if self._etcd is not None:
            self.take().stop()
        if self._warm is not None:
            self.take_warm().close()


def run_main(argv: Sequence[str] | None = None, early_etcd: Any = None, early_warm: Any = None) -> NoReturn:
    early = _Early(early_etcd, early_warm)
    try:
        spellings = _spellings(elastic_run)  # argparse's unique-prefix abbreviations, as torchrun takes them
        prepare = lambda args: expand_abbreviations(args, *spellings)  # noqa: E731
        entry(elastic_run, "elastic-run", argv, obj=early, prepare=prepare, error=_said, closed=console_closed)
    finally:
        early.stop()


def ctl_main(argv: Sequence[str] | None = None) -> NoReturn:
    from .ctl import elastic_ctl

    entry(elastic_ctl, "elastic-ctl", argv)
