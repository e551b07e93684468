"""elastic-run's options as the command line gives them (``RunOptions``), parsed into the typed
``launcher.plan.RunRequest`` (``request_from``); ``plan_from`` builds its plan.

A field's default is the option's default; validation is here, at the edge: a ``UsageError``
names the first bad option. Lines torchrun says while parsing (ignored options) are said here; its
warnings about the run (OMP_NUM_THREADS, NUMA, where the logs go) are the plan's notes, said when it
launches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from launcher.config import CrashLoop
from launcher.launch import LaunchPlan
from launcher.output import load_logs_specs
from launcher.output.console import say
from launcher.plan import STOP_SIGNALS_TEXT, RunRequest, build_plan, hang_timeouts
from launcher.signals import parse_signals
from launcher.slurm.defaults import slurm_defaults
from rendezvous.settings import parse_conf

from .options import (
    beside_of,
    implies_standalone,
    parse_filters,
    parse_nodes,
    parse_nproc_per_node,
    parse_ranks_filter,
    parse_std,
    rendezvous_endpoint,
    say_static_ignored,
    shutdown_timeout,
    worker_argv,
)

__all__ = ["RunOptions", "plan_from", "request_from"]


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
    master_port: int | None = None  # the port of the agent's store on group rank 0's node
    logs_specs: Any = None  # the name of a torch LogsSpecs entry point, or (from Python) an instance
    log_line_prefix_template: str | None = None  # from Python; the CLI reads $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    numa_binding: str | None = None
    signals_to_handle: str = STOP_SIGNALS_TEXT
    stop_grace: float | None = None
    heartbeat_timeout: float | None = None
    first_heartbeat_timeout: float | None = None
    http_port: int | None = None
    http_host: str = "0.0.0.0"
    virtual_local_rank: bool = False
    warm_start: bool = True
    preload: str = ""
    checkpoint_dir: str | None = None
    checkpoint_every: int = 10
    crash_loop_restarts: int = 3
    health_check: str = ""
    replace_stragglers: bool = False
    preflight: bool = False
    progress_window: float = 300.0
    lighthouse: str | None = None  # a torchft Lighthouse replica beside the agent: its id
    lighthouse_port: int = 29510
    lighthouse_min_replicas: int = 1
    given: frozenset[str] | None = None  # the options given (flag or PET_*); None: all (the Python API)


def plan_from(opts: RunOptions) -> LaunchPlan:
    """elastic-run's options -> a validated LaunchPlan (a UsageError names the first bad option)."""
    request = request_from(opts)
    return build_plan(request)


def _endpoint(opts: RunOptions) -> str | None:
    """etcd's endpoint; None for a job on this node alone: --standalone, or one node and no endpoint
    (torchrun's ``torchrun --nproc-per-node 2 train.py``), said in one line."""
    if not opts.standalone and implies_standalone(opts.rdzv_backend, opts.rdzv_endpoint, opts.nnodes):
        say("no --rdzv-endpoint and one node: running it here alone, on a local etcd (as --standalone)")
        return None
    return rendezvous_endpoint(opts.standalone, opts.rdzv_backend, opts.rdzv_endpoint, opts.rdzv_id)


# options a RunRequest takes as the command line gave them (click checked their type and range)
_AS_GIVEN = (
    "max_restarts",
    "monitor_interval",
    "role",
    "event_log_handler",
    "log_dir",
    "log_line_prefix_template",
    "local_addr",
    "signals_to_handle",
    "numa_binding",
    "virtual_local_rank",
    "warm_start",
    "checkpoint_every",
    "health_check",
    "replace_stragglers",
    "preflight",
    "http_port",
    "http_host",
)


def request_from(opts: RunOptions) -> RunRequest:
    """elastic-run's options, with SLURM's defaults in, parsed into a RunRequest: each option's text
    by its parser (``launcher.cli.options``), in the order torchrun reports a bad one."""
    changes, slurm = slurm_defaults(opts.given, opts.standalone)
    opts = replace(opts, **changes)
    endpoint = _endpoint(opts)
    nodes = parse_nodes(opts.nnodes, standalone=endpoint is None)
    nproc = parse_nproc_per_node(opts.nproc_per_node)
    argv = worker_argv(
        opts.script, opts.script_args, module=opts.module, no_python=opts.no_python, run_path=opts.run_path
    )
    redirects, tee = parse_std(opts.redirects, "--redirects"), parse_std(opts.tee, "--tee")
    ranks_filter = parse_ranks_filter(opts.local_ranks_filter)
    say_static_ignored(opts.node_rank, opts.master_addr)
    return RunRequest(
        # the option parsers' (launcher.cli.options) first, then what other modules parse
        stdout_filters=parse_filters(opts.duplicate_stdout_filters),
        stderr_filters=parse_filters(opts.duplicate_stderr_filters),
        preload=parse_filters(opts.preload),
        stop_grace=shutdown_timeout(opts.stop_grace),
        lighthouse=beside_of(opts.lighthouse, opts.lighthouse_port, opts.lighthouse_min_replicas),
        logs_specs=_logs_specs(opts, redirects, tee, ranks_filter),
        signals=parse_signals(opts.signals_to_handle),
        rdzv_conf=parse_conf(opts.rdzv_conf),
        hang_timeouts=hang_timeouts(opts.first_heartbeat_timeout, opts.heartbeat_timeout),
        argv=tuple(argv),
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        nproc_per_node=nproc,
        endpoint=endpoint,
        run_id=opts.rdzv_id or None,
        redirects=redirects,
        tee=tee,
        ranks_filter=ranks_filter,
        store_port=opts.master_port or None,
        checkpoint_dir=opts.checkpoint_dir or None,
        crash_loop=CrashLoop(opts.crash_loop_restarts, opts.progress_window),
        **{name: getattr(opts, name) for name in _AS_GIVEN},
        allocation=slurm.etcd if slurm is not None else None,
        node_name=slurm.job.node_name if slurm is not None else None,
    )


def _logs_specs(opts: RunOptions, redirects: Any, tee: Any, ranks_filter: Any) -> Any:
    """A torch LogsSpecs: the instance given from Python, or the one --logs-specs names (None: the built-in layout)."""
    if opts.logs_specs is None or isinstance(opts.logs_specs, str):
        return load_logs_specs(opts.logs_specs, opts.log_dir, redirects, tee, ranks_filter)
    return opts.logs_specs
