"""``elastic-run`` (torchrun's options, on etcd v3) and ``elastic-ctl`` (look at a job).

Every option also reads torchrun's ``PET_<NAME>`` environment variable. Bad input ends with one
line on stderr naming what was wrong and exit code 2; see launcher/errors.py for the others.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from launcher.errors import EXIT_SIGNAL_BASE, EXIT_USAGE, LauncherError, UsageError, describe_code, rendezvous_failure
from launcher.hangs.hangrules import positive_seconds
from launcher.launch import launch
from launcher.output.console import console_closed, say, set_log_format
from launcher.workers.numa import MODES as NUMA_MODES
from rendezvous.errors import RendezvousError, RendezvousSettingsError

from .helpfmt import GroupedCommand, rdzv_conf_help
from .options import (
    expand_abbreviations,
)
from .parse import RunOptions, plan_from

__all__ = ["elastic_run", "run_main", "ctl_main"]

_CONTEXT = {"help_option_names": ["-h", "--help"], "allow_interspersed_args": False, "max_content_width": 100}


def _option(*names: str, env: str | None, **kwargs: Any) -> Callable:
    """A torchrun option: both spellings (--a-b and --a_b), and PET_<NAME> from the environment
    (for the options torchrun reads it for)."""
    spelled = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            spelled.append("--" + name[2:].replace("-", "_"))
    return click.option(*spelled, envvar=f"PET_{env}" if env else None, show_envvar=False, **kwargs)


class _Seconds(click.ParamType):
    """A hang timeout: ``positive_seconds``'s check, as the launch API and the rules make it."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float | None:
        if isinstance(value, float):
            return value
        try:
            return positive_seconds(float(value), "it")
        except ValueError:
            self.fail(f"{value!r} is not a positive number of seconds", param, ctx)


_SECONDS = _Seconds()


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
@_option("--nnodes", env="NNODES", default="1:1", show_default=True, help="Number of nodes, N or MIN:MAX.")
@_option(
    "--nproc-per-node",
    env="NPROC_PER_NODE",
    default="1",
    show_default=True,
    help="Workers per node: a number, cpu, gpu or auto.",
)
@_option(
    "--rdzv-backend",
    env="RDZV_BACKEND",
    default="etcd-v3",
    show_default=True,
    help="Rendezvous backend: etcd-v3 (alias etcd).",
)
@_option("--rdzv-endpoint", env="RDZV_ENDPOINT", default="", help="etcd endpoints, host:port[,host:port...].")
@_option("--rdzv-id", env="RDZV_ID", default=None, help="Job id, the same on every node.")
@_option(
    "--rdzv-conf",
    env="RDZV_CONF",
    default="",
    help="Rendezvous settings, key=value,... (the keys: --help-rdzv-conf).",
)
@_option("--standalone", env="STANDALONE", is_flag=True, help="Single node: start a local etcd, random job id.")
@_option(
    "--max-restarts",
    env="MAX_RESTARTS",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Worker group restarts after a failure.",
)
@_option(
    "--monitor-interval",
    env="MONITOR_INTERVAL",
    type=click.FloatRange(min=0, min_open=True),
    default=0.1,
    show_default=True,
    help="Seconds between worker checks.",
)
@_option(
    "--start-method",
    env="START_METHOD",
    type=click.Choice(["spawn", "fork", "forkserver"]),
    default="spawn",
    help="Accepted for torchrun compatibility; workers are always new processes.",
)
@_option(
    "--event-log-handler",
    env="EVENT_LOG_HANDLER",
    type=click.Choice(["null", "console"]),
    default="null",
    show_default=True,
    help="Where the agent's events go: null, or console (one JSON object per event, on stderr).",
)
@_option("--role", env="ROLE", default="default", show_default=True, help="ROLE_NAME of the workers.")
@_option("-m", "--module", env="MODULE", is_flag=True, help="Run SCRIPT as a module (python -m).")
@_option("--no-python", env="NO_PYTHON", is_flag=True, help="Run SCRIPT as a program, not with python.")
@_option("--run-path", env="RUN_PATH", is_flag=True, help="Run SCRIPT with runpy.run_path.")
@_option("--log-dir", env="LOG_DIR", default=None, help="Directory for per-attempt, per-rank logs and error files.")
@_option(
    "-r",
    "--redirects",
    env="REDIRECTS",
    default="0",
    help="Send output to log files only: 0-3 or LOCAL_RANK:0-3,... (--tee still shows it).",
)
@_option(
    "-t",
    "--tee",
    env="TEE",
    default="0",
    help="Copy output to log files and to the console, prefixed: 0-3 or LOCAL_RANK:0-3,...",
)
@_option("--local-ranks-filter", env="LOCAL_RANKS_FILTER", default="", help="Show only these local ranks, e.g. 0,2.")
@_option(
    "--duplicate-stdout-filters",
    env="DUPLICATE_STDOUT_FILTERS",
    default="",
    help="Copy teed stdout lines containing any of these (a,b; ,, is a comma) to attempt_<n>/filtered_stdout.log.",
)
@_option(
    "--duplicate-stderr-filters",
    env="DUPLICATE_STDERR_FILTERS",
    default="",
    help="The same for stderr, to attempt_<n>/filtered_stderr.log.",
)
@_option("--local-addr", env="LOCAL_ADDR", default=None, help="This node's address as the others reach it.")
@_option("--node-rank", env="NODE_RANK", type=int, default=0, help="Static rendezvous only: ignored.")
@_option("--master-addr", env="MASTER_ADDR", default=None, help="Static rendezvous only: ignored.")
@_option(
    "--master-port",
    env="MASTER_PORT",
    type=int,
    default=None,
    help="The port of the c10d store that group rank 0's agent hosts (default: a free one each round).",
)
@_option(
    "--logs-specs",
    env=None,
    default=None,
    help="A LogsSpecs class from the torchrun.logs_specs entry points; default: the built-in layout.",
)
@_option(
    "--numa-binding",
    env=None,
    type=click.Choice(list(NUMA_MODES)),
    default=None,
    help="Bind each worker to the CPUs near its GPU (or its share of the NUMA nodes).",
)
@_option(
    "--signals-to-handle",
    env="SIGNALS_TO_HANDLE",
    default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    show_default=True,
    help="Signals that stop the job gracefully; the workers get the same signal.",
)
@_option(
    "--shutdown-timeout",
    "--stop-grace",
    "stop_grace",
    env="SHUTDOWN_TIMEOUT",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds between the stop signal and SIGKILL [default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30].",
)
@_option(
    "--heartbeat-timeout",
    env="HEARTBEAT_TIMEOUT",
    type=_SECONDS,
    default=None,
    help="Seconds without elastic.heartbeat() after which a worker is hung [default: learned: "
    "5x the slowest step seen after 5 steps, at least 5 s].",
)
@_option(
    "--first-heartbeat-timeout",
    env="FIRST_HEARTBEAT_TIMEOUT",
    type=_SECONDS,
    default=None,
    help="Seconds from a worker's start to its first heartbeat (start-up, loading, compilation) "
    "[default: 900; when given, a worker that never beats is judged by it].",
)
@_option(
    "--http-port",
    env="HTTP_PORT",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics (Prometheus), /healthz and /readyz on this port (0: a free one, printed) [default: off].",
)
@_option(
    "--http-host", env="HTTP_HOST", default="0.0.0.0", show_default=True, help="The address --http-port listens on."
)
@_option(
    "--lighthouse",
    env="LIGHTHOUSE",
    default=None,
    metavar="ID",
    help="Start a torchft Lighthouse replica beside this agent, serving lighthouse ID from etcd (every "
    "replica of one ID shares one quorum state), and export TORCHFT_LIGHTHOUSE to the workers.",
)
@_option(
    "--lighthouse-port",
    env="LIGHTHOUSE_PORT",
    type=click.IntRange(0, 65535),
    default=29510,
    show_default=True,
    help="The replica's gRPC port (0: a free one); its status page is on the next one.",
)
@_option(
    "--lighthouse-min-replicas",
    env="LIGHTHOUSE_MIN_REPLICAS",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Replica groups a quorum needs at least (torchft's --min_replicas).",
)
@_option(
    "--warm-start/--no-warm-start",
    env="WARM_START",
    default=True,
    show_default=True,
    help="Fork Python workers from an interpreter that has imported torch (and --preload) already.",
)
@_option(
    "--preload",
    env="PRELOAD",
    default="",
    metavar="MODULES",
    help="More modules (comma-separated) for that interpreter to import, as the workers will.",
)
@_option(
    "--checkpoint-dir",
    env="CHECKPOINT_DIR",
    default=None,
    metavar="DIR",
    help="Where the agent copies the workers' elastic.checkpoint saves (else they stay in memory only).",
)
@_option(
    "--checkpoint-every",
    env="CHECKPOINT_EVERY",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    metavar="N",
    help="A copy to --checkpoint-dir every N saves of a rank (and one at the end).",
)
@_option(
    "--virtual-local-rank",
    env="VIRTUAL_LOCAL_RANK",
    is_flag=True,
    help="LOCAL_RANK=0 for every worker, each seeing only its own CUDA device.",
)
@click.option(
    "--log-format",
    envvar="ELASTIC_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="The agent's own lines: text, or one JSON object each (workers' lines untouched).",
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def elastic_run(early: _Early | None, log_format: str, **opts: Any) -> int:
    """Launch SCRIPT on this node as one agent of an elastic job (torchrun's options)."""
    set_log_format(log_format)
    ctx = click.get_current_context()
    given = frozenset(name for name in opts if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT))
    plan = plan_from(RunOptions(**opts, given=given))
    return launch(plan, early_etcd=early.take() if early is not None else None).exit_code


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


def _entry(command: click.Command, prog: str, argv: Sequence[str] | None, obj: Any = None) -> NoReturn:
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        if command is elastic_run:  # argparse's unique-prefix abbreviations, as torchrun takes them
            args = expand_abbreviations(args, *_spellings(command))
        code = command.main(args=args, prog_name=prog, standalone_mode=False, obj=obj)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        _error(prog, f"error: {' '.join(exc.format_message().split())}")
        code = EXIT_USAGE
    except click.Abort:
        code = EXIT_SIGNAL_BASE + signal.SIGINT
    except (UsageError, RendezvousSettingsError) as exc:
        _error(prog, f"error: {exc}")
        code = EXIT_USAGE
    except (LauncherError, RendezvousError) as exc:
        code = (exc if isinstance(exc, LauncherError) else rendezvous_failure(exc)).exit_code
        if str(exc):
            _error(prog, _last_line(str(exc), code) if prog == "elastic-run" else str(exc))
    except KeyboardInterrupt:
        code = EXIT_SIGNAL_BASE + signal.SIGINT
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        console_closed()  # the exit code stays the run's, not Python's 120 for a failed flush
    raise SystemExit(code if isinstance(code, int) else 0)


def _last_line(message: str, code: int) -> str:
    """The agent's last line: why it exits, with the exit code and whether a retry may help."""
    row = describe_code(code)
    if row is None or code == EXIT_USAGE:
        return message
    return f"{message} [exit {code}: {'worth a retry' if row.retry else 'do not retry'}]"


def _error(prog: str, line: str) -> None:
    """The one line of a failed command (a JSON object under elastic-run's --log-format json)."""
    if prog == "elastic-run":
        say(line, level="error")
    else:
        sys.stderr.write(f"{prog}: {line}\n")


class _Early:
    """An etcd that ``launcher.cli.main`` started before the heavy imports, for --standalone: the
    launch takes it, or it is stopped when the command ends without one (bad input, not standalone)."""

    def __init__(self, etcd: Any) -> None:
        self._etcd = etcd

    def take(self) -> Any:
        etcd, self._etcd = self._etcd, None
        return etcd

    def stop(self) -> None:
        if self._etcd is not None:
            self.take().stop()


def run_main(argv: Sequence[str] | None = None, early_etcd: Any = None) -> NoReturn:
    early = _Early(early_etcd)
    try:
        _entry(elastic_run, "elastic-run", argv, obj=early)
    finally:
        early.stop()


def ctl_main(argv: Sequence[str] | None = None) -> NoReturn:
    from .ctl import elastic_ctl

    _entry(elastic_ctl, "elastic-ctl", argv)


def lighthouse_main(argv: Sequence[str] | None = None) -> NoReturn:
    from .lighthouse import elastic_lighthouse

    _entry(elastic_lighthouse, "elastic-lighthouse", argv)
