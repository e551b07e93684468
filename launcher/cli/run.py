"""``elastic-run`` (torchrun's options, on etcd v3) and ``elastic-ctl`` (look at a job).

Every option also reads torchrun's ``PET_<NAME>`` environment variable. Bad input ends with one
line on stderr naming what was wrong and exit code 2; see launcher/errors.py for the others.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from launcher.config import AgentConfig
from launcher.errors import EXIT_SIGNAL_BASE, EXIT_USAGE, LauncherError, UsageError, describe_code, rendezvous_failure
from launcher.hangs.rules import HangTimeouts
from launcher.launch import LaunchPlan, launch
from launcher.output import DefaultLayout, TorchLogsSpecsLayout, load_logs_specs
from launcher.output.console import say, set_log_format
from launcher.output.plan import parse_filters, parse_ranks_filter, parse_std
from launcher.workers.env import OMP_WARNING, virtual_device
from launcher.workers.numa import MODES as NUMA_MODES
from launcher.workers.numa import binding_commands
from rendezvous.errors import RendezvousError, RendezvousSettingsError
from rendezvous.rounds.handler import default_node_id
from rendezvous.settings import RendezvousSettings

from .options import (
    NodeRange,
    expand_abbreviations,
    parse_nnodes,
    parse_nproc_per_node,
    parse_rdzv_backend,
    parse_signals,
    worker_argv,
)

__all__ = ["elastic_run", "plan_from_options", "run_main", "ctl_main"]

_CONTEXT = {"help_option_names": ["-h", "--help"], "allow_interspersed_args": False, "max_content_width": 100}


def _option(*names: str, env: str | None, **kwargs: Any) -> Callable:
    """A torchrun option: both spellings (--a-b and --a_b), and PET_<NAME> from the environment
    (for the options torchrun reads it for)."""
    spelled = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            spelled.append("--" + name[2:].replace("-", "_"))
    return click.option(*spelled, envvar=f"PET_{env}" if env else None, show_envvar=False, **kwargs)


@click.command("elastic-run", context_settings=_CONTEXT)
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
@_option("--rdzv-conf", env="RDZV_CONF", default="", help="Rendezvous settings, key=value,... (see README).")
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
@_option("--master-port", env="MASTER_PORT", type=int, default=None, help="Static rendezvous only: ignored.")
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
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds without elastic.heartbeat() after which a worker is hung [default: learned: "
    "5x the slowest step seen after 5 steps, at least 5 s].",
)
@_option(
    "--first-heartbeat-timeout",
    env="FIRST_HEARTBEAT_TIMEOUT",
    type=click.FloatRange(min=0, min_open=True),
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
def elastic_run(**opts: Any) -> int:
    """Launch SCRIPT on this node as one agent of an elastic job (torchrun's options)."""
    set_log_format(opts["log_format"])
    plan = plan_from_options(opts)
    early, _EARLY[0] = _EARLY[0], None  # launch() uses it or stops it
    return launch(plan, early_etcd=early).exit_code


def plan_from_options(opts: dict[str, Any]) -> LaunchPlan:
    """elastic-run's options -> a validated LaunchPlan (a UsageError names the first bad option).

    Lines torchrun says while parsing (ignored options) are said here; its warnings about the run
    (OMP_NUM_THREADS, NUMA, where the logs go) are the plan's notes, said when it launches.
    """
    endpoint = _rendezvous_endpoint(opts)
    nodes = parse_nnodes(opts["nnodes"])
    nproc = parse_nproc_per_node(opts["nproc_per_node"])
    argv = worker_argv(
        opts["script"],
        opts["script_args"],
        module=opts["module"],
        no_python=opts["no_python"],
        run_path=opts["run_path"],
    )
    redirects, tee = parse_std(opts["redirects"], "--redirects"), parse_std(opts["tee"], "--tee")
    ranks_filter = parse_ranks_filter(opts["local_ranks_filter"])
    signals = parse_signals(opts["signals_to_handle"])
    stop_grace = _shutdown_timeout(opts["stop_grace"])
    if opts["virtual_local_rank"]:
        _check_virtual_devices(nproc)
    cpu_binding, numa_line = binding_commands(opts["numa_binding"], nproc)
    nodes, run_id = _job_identity(opts, nodes, standalone=endpoint is None)
    if opts["master_addr"] or opts["master_port"] or opts["node_rank"]:
        say("--node-rank/--master-addr/--master-port belong to static rendezvous and are ignored")
    settings = RendezvousSettings.from_conf(run_id, nodes.min_nodes, nodes.max_nodes, opts["rdzv_conf"], warn=say)
    node_id = default_node_id()
    log_root, temporary = _log_root(opts["log_dir"], run_id, node_id)
    custom_logs = opts["logs_specs"]  # a LogsSpecs instance from launcher.api, else the name to look up
    if custom_logs is None or isinstance(custom_logs, str):
        custom_logs = load_logs_specs(custom_logs, opts["log_dir"], redirects, tee, ranks_filter)
    keep_files = bool(redirects or tee)
    notes = [OMP_WARNING] if nproc > 1 and "OMP_NUM_THREADS" not in os.environ else []  # as torchrun
    notes += [numa_line] if numa_line else []
    notes += [f"log files go to {log_root} (set --log-dir to choose)"] if temporary and keep_files else []
    config = AgentConfig(
        argv=tuple(argv),
        nproc_per_node=nproc,
        max_restarts=opts["max_restarts"],
        monitor_interval=opts["monitor_interval"],
        role=opts["role"],
        stop_grace=stop_grace,
        logs=_output_layout(opts, custom_logs, log_root, redirects, tee, ranks_filter),
        virtual_local_rank=opts["virtual_local_rank"],
        event_log_handler=opts["event_log_handler"],
        cpu_binding=cpu_binding,
        hang_timeouts=_hang_timeouts(opts),
    )
    return LaunchPlan(
        config,
        settings,
        endpoint,
        node_id,
        local_addr=opts["local_addr"] or ("127.0.0.1" if endpoint is None else None),
        signals=signals,
        exported=(("TORCHELASTIC_SIGNALS_TO_HANDLE", opts["signals_to_handle"]),),
        log_root=log_root,
        remove_logs=temporary and not keep_files,
        notes=tuple(notes),
        http_host=opts.get("http_host") or "0.0.0.0",
        http_port=opts.get("http_port"),
    )


def _rendezvous_endpoint(opts: dict[str, Any]) -> str | None:
    """etcd's endpoint, or None for --standalone (which overrides the rendezvous options, saying so)."""
    if opts["standalone"]:
        given = [
            f"--rdzv-{name.split('_')[1]}"
            for name in ("rdzv_backend", "rdzv_endpoint", "rdzv_id")
            if opts[name] not in (None, "", "etcd-v3", "none")
        ]
        if given:
            say(f"--standalone: ignoring {', '.join(given)}; a local etcd is started for this job")
        return None
    if str(opts["rdzv_backend"]).strip().lower() == "etcd-v2":
        say("--rdzv-backend etcd-v2: using etcd's v3 API (etcd 3.6 removed v2)")
    parse_rdzv_backend(opts["rdzv_backend"])
    return opts["rdzv_endpoint"] or ""


def _job_identity(opts: dict[str, Any], nodes: NodeRange, *, standalone: bool) -> tuple[NodeRange, str]:
    """(the node range, the job id): one node and a fresh id for --standalone; else both required."""
    if standalone:
        if nodes.max_nodes != 1:
            say("--standalone runs one node; ignoring --nnodes")
        return parse_nnodes("1"), f"standalone-{uuid.uuid4().hex[:12]}"
    if not opts["rdzv_endpoint"]:
        raise UsageError("--rdzv-endpoint is required (host:port of etcd), or use --standalone")
    if opts["rdzv_id"] in (None, ""):
        raise UsageError("--rdzv-id is required: the same job id on every node")
    return nodes, opts["rdzv_id"]


def _check_virtual_devices(nproc: int) -> None:
    """--virtual-local-rank: the last local rank has a device, so every one has (the rule workers are started by)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        virtual_device(nproc - 1, visible)
    except ValueError:
        raise UsageError(
            f"--virtual-local-rank: CUDA_VISIBLE_DEVICES={visible} names fewer devices than --nproc-per-node {nproc}"
        ) from None


def _output_layout(opts: dict, custom: Any, log_root: str, redirects: Any, tee: Any, ranks_filter: Any):
    """The output strategy: the torch LogsSpecs --logs-specs names, else the built-in layout."""
    template = opts.get("log_line_prefix_template") or os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None
    filters = parse_filters(opts["duplicate_stdout_filters"]), parse_filters(opts["duplicate_stderr_filters"])
    if custom is not None:
        return TorchLogsSpecsLayout(custom, template, *filters)
    return DefaultLayout(log_root, redirects, tee, ranks_filter, template, *filters)


def _hang_timeouts(opts: dict[str, Any]) -> HangTimeouts:
    """--heartbeat-timeout and --first-heartbeat-timeout (a Python caller's values are checked here too)."""
    first, steady = opts.get("first_heartbeat_timeout"), opts.get("heartbeat_timeout")
    try:
        return HangTimeouts(first=900.0 if first is None else first, steady=steady, judge_first=first is not None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _shutdown_timeout(value: float | None) -> float:
    """--shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s (torchrun's rule)."""
    if value is not None:
        return value
    text = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UsageError(f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a number of seconds >= 0, not {text!r}")
    return seconds


_EARLY: list[Any] = [None]  # an etcd started by launcher.cli.main before the imports, for --standalone


def _log_root(log_dir: str | None, run_id: str, node_id: str) -> tuple[str, bool]:
    if log_dir is None:
        return tempfile.mkdtemp(prefix=f"elastic-{run_id}-"), True
    root = os.path.join(log_dir, run_id, node_id)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-dir {log_dir!r} cannot be used: {exc.strerror}") from None
    return root, False


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


def _entry(command: click.Command, prog: str, argv: Sequence[str] | None) -> NoReturn:
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        if command is elastic_run:  # argparse's unique-prefix abbreviations, as torchrun takes them
            args = expand_abbreviations(args, *_spellings(command))
        code = command.main(args=args, prog_name=prog, standalone_mode=False)
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
    sys.stdout.flush()
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


def run_main(argv: Sequence[str] | None = None, early_etcd: Any = None) -> NoReturn:
    _EARLY[0] = early_etcd
    try:
        _entry(elastic_run, "elastic-run", argv)
    finally:
        if _EARLY[0] is not None:  # started early but not used (bad input, or not standalone after all)
            _EARLY[0].stop()


def ctl_main(argv: Sequence[str] | None = None) -> NoReturn:
    from .ctl import elastic_ctl

    _entry(elastic_ctl, "elastic-ctl", argv)
