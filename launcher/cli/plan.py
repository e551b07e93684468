"""elastic-run's options, typed (``RunOptions``), and the one plan built from them (``plan_from``):
the CLI and the Python launch API (``launcher.api``) both build a ``RunOptions`` and run its plan.

A field's default is the option's default; validation is here, at the edge: a ``UsageError``
names the first bad option. Lines torchrun says while parsing (ignored options) are said here; its
warnings about the run (OMP_NUM_THREADS, NUMA, where the logs go) are the plan's notes, said when it
launches.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from launcher.config import AgentConfig
from launcher.errors import UsageError
from launcher.hangs.rules import HangTimeouts
from launcher.launch import LaunchPlan
from launcher.lighthouse import Beside
from launcher.output import DefaultLayout, TorchLogsSpecsLayout, load_logs_specs
from launcher.output.console import say
from launcher.output.plan import parse_filters, parse_ranks_filter, parse_std
from launcher.workers.env import OMP_WARNING, virtual_device
from launcher.workers.numa import binding_commands
from rendezvous.job.keys import JobKeys
from rendezvous.rounds.member import default_node_id
from rendezvous.settings import RendezvousSettings

from .from_slurm import from_slurm
from .options import NodeRange, parse_nnodes, parse_nproc_per_node, parse_rdzv_backend, parse_signals, worker_argv

__all__ = ["RunOptions", "plan_from"]


@dataclass(frozen=True)
class RunOptions:
    """Every elastic-run option as the command line gives it (strings where torchrun parses them later)."""

    script: str
    script_args: tuple[str, ...] = ()
    nnodes: str = "1:1"
    nproc_per_node: str = "1"
    rdzv_backend: str = "etcd-v3"
    rdzv_endpoint: str | None = ""
    rdzv_id: str | None = None
    rdzv_conf: str = ""
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"  # accepted, as torchrun's; workers are always fresh processes
    event_log_handler: str = "null"
    role: str = "default"
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    log_dir: str | None = None
    redirects: str | None = "0"
    tee: str | None = "0"
    local_ranks_filter: str | None = ""
    duplicate_stdout_filters: str | None = ""
    duplicate_stderr_filters: str | None = ""
    local_addr: str | None = None
    node_rank: int | None = 0  # static rendezvous only: ignored, said so
    master_addr: str | None = None  # ditto
    master_port: int | None = None  # ditto
    logs_specs: Any = None  # the name of a torch LogsSpecs entry point, or (from Python) an instance
    log_line_prefix_template: str | None = None  # from Python; the CLI reads $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    numa_binding: str | None = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    stop_grace: float | None = None
    heartbeat_timeout: float | None = None
    first_heartbeat_timeout: float | None = None
    http_port: int | None = None
    http_host: str = "0.0.0.0"
    virtual_local_rank: bool = False
    lighthouse: str | None = None  # a torchft Lighthouse replica beside the agent: its id
    lighthouse_port: int = 29510
    lighthouse_min_replicas: int = 1
    given: frozenset[str] | None = None  # the options given (flag or PET_*); None: all (the Python API)


class _Parsed(NamedTuple):
    """The options that need parsing, checked in torchrun's order before anything is made on disk."""

    nproc: int
    argv: list[str]
    redirects: Any
    tee: Any
    ranks_filter: Any
    signals: tuple
    stop_grace: float
    cpu_binding: Any
    numa_line: str | None


def _parse(opts: RunOptions) -> _Parsed:
    nproc = parse_nproc_per_node(opts.nproc_per_node)
    argv = worker_argv(
        opts.script, opts.script_args, module=opts.module, no_python=opts.no_python, run_path=opts.run_path
    )
    redirects, tee = parse_std(opts.redirects, "--redirects"), parse_std(opts.tee, "--tee")
    ranks_filter = parse_ranks_filter(opts.local_ranks_filter)
    signals = parse_signals(opts.signals_to_handle)
    stop_grace = _shutdown_timeout(opts.stop_grace)
    if opts.virtual_local_rank:
        _check_virtual_devices(nproc)
    cpu_binding, numa_line = binding_commands(opts.numa_binding, nproc)
    return _Parsed(nproc, argv, redirects, tee, ranks_filter, signals, stop_grace, cpu_binding, numa_line)


def plan_from(opts: RunOptions) -> LaunchPlan:
    """elastic-run's options -> a validated LaunchPlan (a UsageError names the first bad option)."""
    opts, slurm = from_slurm(opts)
    endpoint = _rendezvous_endpoint(opts)
    nodes = parse_nnodes(opts.nnodes)
    parsed = _parse(opts)
    nodes, run_id = _job_identity(opts, nodes, standalone=endpoint is None)
    if opts.master_addr or opts.master_port or opts.node_rank:
        say("--node-rank/--master-addr/--master-port belong to static rendezvous and are ignored")
    settings = RendezvousSettings.from_conf(run_id, nodes.min_nodes, nodes.max_nodes, opts.rdzv_conf, warn=say)
    node_id = default_node_id() if slurm is None else f"{slurm.job.node_name}-{uuid.uuid4().hex[:6]}"
    log_root, temporary = _log_root(opts.log_dir, run_id, node_id)
    keep_files = bool(parsed.redirects or parsed.tee)
    notes = [OMP_WARNING] if parsed.nproc > 1 and "OMP_NUM_THREADS" not in os.environ else []  # as torchrun
    notes += [parsed.numa_line] if parsed.numa_line else []
    notes += [f"log files go to {log_root} (set --log-dir to choose)"] if temporary and keep_files else []
    return LaunchPlan(
        _agent_config(opts, parsed, log_root, _history_command(settings, None if slurm and slurm.etcd else endpoint)),
        settings,
        endpoint,
        node_id,
        local_addr=opts.local_addr or ("127.0.0.1" if endpoint is None else None),
        signals=parsed.signals,
        exported=(("TORCHELASTIC_SIGNALS_TO_HANDLE", opts.signals_to_handle),),
        log_root=log_root,
        remove_logs=temporary and not keep_files,
        notes=tuple(notes),
        http_host=opts.http_host or "0.0.0.0",
        http_port=opts.http_port,
        allocation=slurm.etcd if slurm is not None else None,
        lighthouse=_lighthouse(opts),
    )


def _lighthouse(opts: RunOptions) -> Beside | None:
    if not opts.lighthouse:
        return None
    return Beside(opts.lighthouse, opts.lighthouse_port, opts.lighthouse_min_replicas)


def _history_command(settings: RendezvousSettings, endpoint: str | None) -> str:
    """``elastic-ctl history ...`` as it can be pasted; "" when the job's etcd stops with the agent
    (--standalone, or the etcd of a SLURM allocation)."""
    return JobKeys(settings.key_prefix, settings.run_id).ctl("history", endpoint) if endpoint else ""


def _agent_config(opts: RunOptions, parsed: _Parsed, log_root: str, history_command: str) -> AgentConfig:
    return AgentConfig(
        argv=tuple(parsed.argv),
        nproc_per_node=parsed.nproc,
        max_restarts=opts.max_restarts,
        monitor_interval=opts.monitor_interval,
        role=opts.role,
        stop_grace=parsed.stop_grace,
        logs=_output_layout(opts, parsed, log_root),
        virtual_local_rank=opts.virtual_local_rank,
        event_log_handler=opts.event_log_handler,
        cpu_binding=parsed.cpu_binding,
        hang_timeouts=_hang_timeouts(opts),
        history_command=history_command,
    )


def _rendezvous_endpoint(opts: RunOptions) -> str | None:
    """etcd's endpoint, or None for --standalone (which overrides the rendezvous options, saying so)."""
    if opts.standalone:
        given = [
            f"--rdzv-{name.split('_')[1]}"
            for name in ("rdzv_backend", "rdzv_endpoint", "rdzv_id")
            if getattr(opts, name) not in (None, "", "etcd-v3", "none")
        ]
        if given:
            say(f"--standalone: ignoring {', '.join(given)}; a local etcd is started for this job")
        return None
    if str(opts.rdzv_backend).strip().lower() == "etcd-v2":
        say("--rdzv-backend etcd-v2: using etcd's v3 API (etcd 3.6 removed v2)")
    parse_rdzv_backend(opts.rdzv_backend)
    return opts.rdzv_endpoint or ""


def _job_identity(opts: RunOptions, nodes: NodeRange, *, standalone: bool) -> tuple[NodeRange, str]:
    """(the node range, the job id): one node and a fresh id for --standalone; else both required."""
    if standalone:
        if nodes.max_nodes != 1:
            say("--standalone runs one node; ignoring --nnodes")
        return parse_nnodes("1"), f"standalone-{uuid.uuid4().hex[:12]}"
    if not opts.rdzv_endpoint:
        raise UsageError("--rdzv-endpoint is required (host:port of etcd), or use --standalone")
    if opts.rdzv_id in (None, ""):
        raise UsageError("--rdzv-id is required: the same job id on every node")
    return nodes, opts.rdzv_id


def _check_virtual_devices(nproc: int) -> None:
    """--virtual-local-rank: the last local rank has a device, so every one has (the rule workers are started by)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        virtual_device(nproc - 1, visible)
    except ValueError:
        raise UsageError(
            f"--virtual-local-rank: CUDA_VISIBLE_DEVICES={visible} names fewer devices than --nproc-per-node {nproc}"
        ) from None


def _output_layout(opts: RunOptions, parsed: _Parsed, log_root: str):
    """The output strategy: a torch LogsSpecs (an instance from Python, or the one --logs-specs names),
    else the built-in layout."""
    custom = opts.logs_specs
    if custom is None or isinstance(custom, str):
        custom = load_logs_specs(custom, opts.log_dir, parsed.redirects, parsed.tee, parsed.ranks_filter)
    template = opts.log_line_prefix_template or os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None
    filters = parse_filters(opts.duplicate_stdout_filters), parse_filters(opts.duplicate_stderr_filters)
    if custom is not None:
        return TorchLogsSpecsLayout(custom, template, *filters)
    return DefaultLayout(log_root, parsed.redirects, parsed.tee, parsed.ranks_filter, template, *filters)


def _hang_timeouts(opts: RunOptions) -> HangTimeouts:
    """--heartbeat-timeout and --first-heartbeat-timeout (a Python caller's values are checked here too)."""
    first, steady = opts.first_heartbeat_timeout, opts.heartbeat_timeout
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


def _log_root(log_dir: str | None, run_id: str, node_id: str) -> tuple[str, bool]:
    if log_dir is None:
        return tempfile.mkdtemp(prefix=f"elastic-{run_id}-"), True
    root = os.path.join(log_dir, run_id, node_id)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-dir {log_dir!r} cannot be used: {exc.strerror}") from None
    return root, False
