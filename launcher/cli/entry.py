"""The console entry of every command (``elastic-run``, ``elastic-ctl``, ``elastic-lighthouse``): one
line per error, the exit codes of ``launcher.errors``' one table, never a traceback. Light on
purpose -- click and the error trees -- so that a program that runs nothing of a job (the
Lighthouse) imports nothing of one to get its exit codes."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from launcher.errors import EXIT_SIGNAL_BASE, EXIT_USAGE, LauncherError, UsageError, describe_code, rendezvous_failure
from rendezvous.errors import RendezvousError, RendezvousSettingsError

__all__ = ["entry", "last_line"]


def entry(
    command: click.Command,
    prog: str,
    argv: Sequence[str] | None,
    obj: Any = None,
    *,
    prepare: Callable[[list[str]], list[str]] = lambda args: args,
    error: Callable[[str, int], None] | None = None,
    closed: Callable[[], None] = lambda: None,
) -> NoReturn:
    """Run ``command`` on ``argv`` (this process's by default) and exit with its code. ``prepare``:
    the arguments as the command reads them (may raise UsageError); ``error(line, code)``: how a
    failure's line is said (``prog: line`` on stderr by default); ``closed()``: called when the
    console is gone at the end (the exit code stays the command's)."""
    say = error or (lambda line, code: sys.stderr.write(f"{prog}: {line}\n"))
    try:
        code = command.main(args=prepare(list(argv) if argv is not None else sys.argv[1:]), prog_name=prog,
                            standalone_mode=False, obj=obj)  # fmt: skip
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        code = EXIT_USAGE
        say(f"error: {' '.join(exc.format_message().split())}", code)
    except click.Abort:
        code = EXIT_SIGNAL_BASE + signal.SIGINT
    except (UsageError, RendezvousSettingsError) as exc:
        code = EXIT_USAGE
        say(f"error: {exc}", code)
    except (LauncherError, RendezvousError) as exc:
        code = (exc if isinstance(exc, LauncherError) else rendezvous_failure(exc)).exit_code
        if str(exc):
            say(str(exc), code)
    except KeyboardInterrupt:
        code = EXIT_SIGNAL_BASE + signal.SIGINT
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        closed()
    raise SystemExit(code if isinstance(code, int) else 0)


def last_line(message: str, code: int) -> str:
    """An agent's last line: why it exits, with the exit code and whether a retry may help."""
    row = describe_code(code)
    if row is None or code == EXIT_USAGE:
        return message
    return f"{message} [exit {code}: {'worth a retry' if row.retry else 'do not retry'}]"
