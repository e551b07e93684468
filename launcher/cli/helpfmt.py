"""``elastic-run --help`` as people read it: options in groups, one spelling each (torchrun's
``--a_b`` spellings and unique prefixes are still accepted), and ``--help-rdzv-conf`` for the
``--rdzv-conf`` keys."""

from __future__ import annotations

from typing import Any

import click

from rendezvous.settings import CONF_KEYS, TORCH_ALIASES

__all__ = ["GroupedCommand", "GROUPS", "MOOT", "rdzv_conf_help"]

# (title, the options it holds, as help shows them); options in no group go under "Other"
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The job", ("--nnodes", "--nproc-per-node", "--max-restarts", "--standalone")),
    ("Rendezvous (etcd)", ("--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--rdzv-backend", "--local-addr")),
    (
        "Workers",
        (
            "--no-python",
            "--module",
            "--run-path",
            "--role",
            "--numa-binding",
            "--virtual-local-rank",
            "--warm-start",
            "--preload",
        ),
    ),
    ("Hangs", ("--heartbeat-timeout", "--first-heartbeat-timeout")),
    ("Stopping", ("--signals-to-handle", "--shutdown-timeout", "--monitor-interval")),
    (
        "Output and logs",
        (
            "--log-dir",
            "--redirects",
            "--tee",
            "--local-ranks-filter",
            "--duplicate-stdout-filters",
            "--duplicate-stderr-filters",
            "--log-format",
            "--logs-specs",
            "--event-log-handler",
        ),
    ),
    ("Metrics and probes", ("--http-port", "--http-host")),
    ("torchft", ("--lighthouse", "--lighthouse-port", "--lighthouse-min-replicas")),
)
# torchrun's options that a rendezvous here makes moot: accepted, listed in one line
MOOT = ("--node-rank", "--master-addr", "--master-port", "--start-method")


class GroupedCommand(click.Command):
    """A command whose help lists its options by ``GROUPS``, each under its first spelling."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = _first_spelling_record(param, ctx)
            if record is not None:
                records[_shown(param)] = record
        placed: set[str] = set(MOOT)
        for title, names in GROUPS:
            rows = [records[name] for name in names if name in records]
            placed.update(names)
            _section(formatter, title, rows)
        _section(formatter, "Other", [row for name, row in records.items() if name not in placed])
        with formatter.section("Accepted as torchrun takes them, with no effect here"):
            formatter.write_text(", ".join(MOOT) + " (static rendezvous, worker start method).")


def _section(formatter: click.HelpFormatter, title: str, rows: list[tuple[str, str]]) -> None:
    if rows:
        with formatter.section(title):
            formatter.write_dl(rows)


def _shown(param: click.Parameter) -> str:
    """The spelling help shows: the first long one with dashes (``--redirects``, not ``-r``)."""
    return next((o for o in param.opts if o.startswith("--") and "_" not in o), param.opts[0])


def _first_spelling_record(param: click.Parameter, ctx: click.Context) -> tuple[str, str] | None:
    """The option's help row with one spelling shown."""
    if not isinstance(param, click.Option) or param.hidden:
        return None
    opts, secondary = param.opts, param.secondary_opts
    param.opts, param.secondary_opts = [_shown(param)], []
    try:
        return param.get_help_record(ctx)
    finally:
        param.opts, param.secondary_opts = opts, secondary


def rdzv_conf_help(ctx: click.Context, _param: Any, value: bool) -> None:
    """``--help-rdzv-conf``: every ``--rdzv-conf`` key with what it does, then exit."""
    if not value or ctx.resilient_parsing:
        return
    width = max(map(len, CONF_KEYS))
    click.echo("--rdzv-conf key=value,... keys (README: Rendezvous rounds, its settings table):")
    for key, (_, _, text) in CONF_KEYS.items():
        click.echo(f"  {key.ljust(width)}  {text}")
    click.echo("torch's names, accepted: " + ", ".join(f"{a} ({b})" for a, b in TORCH_ALIASES.items()))
    ctx.exit(0)
