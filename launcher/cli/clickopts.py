"""elastic-run's click options, made from the option table (``launcher.options.table``): each row's
spellings, default, ``PET_*`` variable and value check as click takes them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import click

from launcher.options.table import OPTIONS, Choice, Option, Seconds, Whole, env_name

__all__ = ["click_options"]


class _Whole(click.IntRange):
    """click's IntRange, without the range appended to the help line (the help says it), and a
    value out of range said as the table says it ("-1 is not an integer >= 0")."""

    def __init__(self, check: Whole) -> None:
        super().__init__(check.minimum, check.maximum)
        self.check = check

    def _describe_range(self) -> str:
        return ""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        number = click.INT.convert(value, param, ctx)  # "'x' is not a valid integer."
        why = self.check.problem(number)
        if why:
            self.fail(f"{number} is not {why}", param, ctx)
        return number


class _SecondsType(click.ParamType):
    name = "seconds"

    def __init__(self, check: Seconds) -> None:
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        why = self.check.problem(seconds)
        if why:
            self.fail(f"{value!r} is not {why}", param, ctx)
        return seconds


def _click_type(check: Whole | Seconds | Choice) -> click.ParamType:
    if isinstance(check, Whole):
        return _Whole(check)
    if isinstance(check, Seconds):
        return _SecondsType(check)
    return click.Choice(list(check.values))


def _click_option(option: Option) -> Callable:
    spellings = list(option.spellings)
    if option.off:
        spellings = [f"{spellings[0]}/{option.off}", *spellings[1:]]
    shown = f"  [default: {option.shown_default}]" if option.shown_default else ""
    kwargs: dict[str, Any] = {"help": option.help + shown, "show_envvar": False, "envvar": env_name(option)}
    if option.flag and not option.off:
        kwargs["is_flag"] = True
    else:
        kwargs["default"] = option.default
    if option.check is not None:
        kwargs["type"] = _click_type(option.check)
    if option.metavar:
        kwargs["metavar"] = option.metavar
    args = [*spellings, option.dest] if option.dest else spellings
    return click.option(*args, **kwargs)


def click_options(options: Sequence[Option] = OPTIONS) -> Callable:
    """A decorator that gives a click command every option of the table."""

    def decorate(command: Callable) -> Callable:
        for option in reversed(options):
            command = _click_option(option)(command)
        return command

    return decorate
