"""``elastic-run --help`` as people read it: options in the groups of the option table
(``launcher.options.table``), each with its own spellings (torchrun's ``--a_b`` spellings and unique
prefixes are still accepted), torchrun's options that take no effect here in one line, every line
within 80 columns; ``--help-rdzv-conf`` for the ``--rdzv-conf`` keys; and the options table of
docs/getting-started.md (``markdown``)."""

from __future__ import annotations

import textwrap
from typing import Any

import click

from launcher.options.table import OPTIONS, SAME, grouped, moot
from rendezvous.settings import CONF_KEYS, TORCH_ALIASES

__all__ = ["GroupedCommand", "WIDTH", "markdown", "rdzv_conf_help"]

WIDTH = 80  # columns every help line fits in


class GroupedCommand(click.Command):
    """A command whose help lists its options by the option table's groups."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = _record(param, ctx)
            if record is not None:
                records[_name(param)] = record
        placed: set[str] = set(moot())
        for title, names in grouped():
            _section(formatter, title, [records[name] for name in names if name in records])
            placed.update(names)
        _section(formatter, "Other", [row for name, row in records.items() if name not in placed])
        with formatter.section("Accepted as torchrun takes them, with no effect here"):
            formatter.write_text(", ".join(moot()) + " (static rendezvous; workers start as --warm-start says).")


def _section(formatter: click.HelpFormatter, title: str, rows: list[tuple[str, str]]) -> None:
    if rows:
        with formatter.section(title):
            formatter.write_dl(rows, col_max=34)


_SHOWN = {o.name: o for o in OPTIONS}


def _name(param: click.Parameter) -> str:
    """The option table's name of a click option (its first long spelling with dashes)."""
    longs = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and "_" not in o]
    return longs[0] if longs else param.opts[0]


def _record(param: click.Parameter, ctx: click.Context) -> tuple[str, str] | None:
    """The option's help row: its spellings as the table shows them (``-m, --module``,
    ``--warm-start / --no-warm-start``), not torchrun's ``--a_b`` ones."""
    if not isinstance(param, click.Option) or param.hidden:
        return None
    row = param.get_help_record(ctx)
    if row is None:
        return None
    option = _SHOWN.get(_name(param))
    if option is None:
        return row
    shown = option.shown + (f" {param.make_metavar(ctx)}" if not param.is_flag else "")
    return shown, row[1]


COMPLETION_SHELLS = ("bash", "zsh", "fish", "tcsh")  # torchrun's shtab writes bash, zsh and tcsh


def print_completion(ctx: click.Context, param: Any, shell: str | None) -> None:
    """``--print-completion SHELL``: elastic-run's completion script for the shell, from click's own
    completion (its options as the table gives them), then exit -- as torchrun's flag does."""
    if shell is None or ctx.resilient_parsing:
        return
    from click.shell_completion import get_completion_class

    completion = get_completion_class(shell)
    if completion is None:
        raise click.BadParameter(f"{shell} has no completion here: bash, zsh and fish have", ctx, param)
    click.echo(completion(ctx.command, {}, "elastic-run", "_ELASTIC_RUN_COMPLETE").source())
    ctx.exit(0)


def rdzv_conf_help(ctx: click.Context, _param: Any, value: bool) -> None:
    """``--help-rdzv-conf``: every ``--rdzv-conf`` key with what it does, then exit."""
    if not value or ctx.resilient_parsing:
        return
    width = max(map(len, CONF_KEYS))
    click.echo("--rdzv-conf key=value,... keys (docs/rendezvous.md: Rendezvous rounds):")
    for key, (_, _, text) in CONF_KEYS.items():
        lines = textwrap.wrap(text, WIDTH - width - 4) or [""]
        click.echo(f"  {key.ljust(width)}  {lines[0]}")
        for line in lines[1:]:
            click.echo(f"  {'':{width}}  {line}")
    aliases = ", ".join(f"{a} ({b})" for a, b in TORCH_ALIASES.items())
    click.echo(textwrap.fill("torch's names, accepted: " + aliases, WIDTH, subsequent_indent="  "))
    ctx.exit(0)


def markdown() -> str:
    """The options table of docs/getting-started.md."""
    rows = ["| option | default | torchrun | meaning |", "| --- | --- | --- | --- |"]
    for option in OPTIONS:
        values = " or ".join(f"`{value}`" for value in option.metavar.split("|")) if option.metavar else ""
        spelled = f"`{option.shown}`" + (f" {values}" if values else "")  # no pipe: a site's code span keeps \\|
        theirs = "same" if option.torchrun == SAME else ("-" if option.torchrun is None else f"`{option.torchrun}`")
        if not option.effect:
            theirs += ", no effect here"
        default = f"`{option.shown_default}`" if option.shown_default else ""
        meaning = (option.doc or option.help).replace("|", "\\|")
        rows.append(f"| {spelled} | {default} | {theirs} | {meaning} |")
    return "\n".join(rows)
