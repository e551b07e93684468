"""elastic-run's options as the command line gives them (``RunOptions``, one field a row of the
option table), parsed into the typed ``launcher.plan.RunRequest`` (``request_from``) whose agent's
config is made here (``agent_config``); ``plan_from`` builds its plan.

A field's default is the option's default; validation is here, at the edge: a ``UsageError``
names the first bad option. Lines torchrun says while parsing (ignored options) are said here; its
warnings about the run (OMP_NUM_THREADS, NUMA, where the logs go) are the plan's notes, said when it
launches.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass, replace
from typing import Any

from launcher.config import AgentConfig, CrashLoop
from launcher.launch import LaunchPlan
from launcher.nodecheck import NodeChecks
from launcher.options.table import OPTIONS
from launcher.options.values import (
    parse_filters,
    parse_nproc_per_node,
    parse_ranks_filter,
    parse_std,
    shutdown_timeout,
    worker_argv,
)
from launcher.output import load_logs_specs
from launcher.output.console import say
from launcher.plan import RunRequest, build_plan, hang_timeouts
from launcher.signals import parse_signals
from launcher.slurm.defaults import slurm_defaults
from rendezvous.settings import parse_conf

from .derive import (
    alone_on_a_free_port,
    beside_of,
    c10d_hosting,
    implies_standalone,
    parse_nodes,
    rendezvous_endpoint,
    say_static_ignored,
)

__all__ = ["RunOptions", "agent_config", "plan_from", "request_from"]


def _fields() -> list[tuple]:
    """RunOptions' fields: the script and its arguments, one a row of the option table (its default;
    a flag's is False), and which were given."""
    rows = [(o.key, Any, field(default=False if o.flag and o.default is None else o.default)) for o in OPTIONS]
    return [("script", str), ("script_args", tuple, field(default=())), *rows, ("given", Any, field(default=None))]


# Every elastic-run option as the command line gives it (strings where torchrun parses them later),
# made from the option table (``launcher.options.table.OPTIONS``). ``given``: the names of the options given
# (flag or PET_*); None: all of them.
RunOptions = make_dataclass("RunOptions", _fields(), frozen=True)
RunOptions.__module__ = __name__


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
    if not opts.standalone and alone_on_a_free_port(opts.rdzv_backend, opts.rdzv_endpoint, opts.nnodes):
        say("--rdzv-endpoint with port 0 and one node: running it here alone, on a local etcd (as --standalone)")
        return None
    return rendezvous_endpoint(opts.standalone, opts.rdzv_backend, opts.rdzv_endpoint, opts.rdzv_id)


# options a RunRequest takes as the command line gave them (click checked their type and range)
_AS_GIVEN = (
    "log_dir",
    "local_addr",
    "signals_to_handle",
    "numa_binding",
    "http_port",
    "http_host",
    "log_line_prefix_template",
)


def request_from(opts: RunOptions) -> RunRequest:
    """elastic-run's options, with SLURM's defaults in, parsed into a RunRequest: each option's text
    by its parser (``launcher.options.values``, beside the option table), in the order torchrun reports a bad one."""
    changes, slurm = slurm_defaults(opts.given, opts.standalone)
    opts = replace(opts, **changes)
    endpoint = _endpoint(opts)
    rdzv_conf = parse_conf(opts.rdzv_conf)
    hosting = c10d_hosting(opts.rdzv_backend, endpoint, rdzv_conf.get("is_host"))
    nodes = parse_nodes(opts.nnodes, standalone=endpoint is None)
    nproc = parse_nproc_per_node(opts.nproc_per_node)
    argv = worker_argv(
        opts.script, opts.script_args, module=opts.module, no_python=opts.no_python, run_path=opts.run_path
    )
    redirects, tee = parse_std(opts.redirects, "--redirects"), parse_std(opts.tee, "--tee")
    ranks_filter = parse_ranks_filter(opts.local_ranks_filter)
    say_static_ignored(opts.node_rank, opts.master_addr)
    return RunRequest(
        # the option parsers' (launcher.options.values) first, then what other modules parse
        stdout_filters=parse_filters(opts.duplicate_stdout_filters),
        stderr_filters=parse_filters(opts.duplicate_stderr_filters),
        agent=agent_config(opts, tuple(argv), nproc),
        lighthouse=beside_of(opts.lighthouse, opts.lighthouse_port, opts.lighthouse_min_replicas),
        logs_specs=_logs_specs(opts, redirects, tee, ranks_filter),
        signals=parse_signals(opts.signals_to_handle),
        rdzv_conf=rdzv_conf,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        endpoint=hosting.endpoint if hosting is not None else endpoint,
        run_id=opts.rdzv_id
        or ("none" if hosting is not None else None),  # torchrun's default id, on the job's own etcd
        hosting=hosting,
        redirects=redirects,
        tee=tee,
        ranks_filter=ranks_filter,
        **{name: getattr(opts, name) for name in _AS_GIVEN},
        allocation=slurm.etcd if slurm is not None else None,
        node_name=slurm.job.node_name if slurm is not None else None,
    )


def agent_config(opts: RunOptions, argv: tuple[str, ...], nproc: int) -> AgentConfig:
    """The agent's settings, made here from the options (the plan adds only what it derives)."""
    return AgentConfig(
        argv=argv,
        nproc_per_node=nproc,
        preload=parse_filters(opts.preload),
        stop_grace=shutdown_timeout(opts.stop_grace),
        hang_timeouts=hang_timeouts(opts.first_heartbeat_timeout, opts.heartbeat_timeout),
        store_port=opts.master_port or None,
        checkpoint_dir=opts.checkpoint_dir or None,
        crash_loop=CrashLoop(opts.crash_loop_restarts, opts.progress_window),
        exit_barrier_timeout=opts.exit_barrier_timeout,
        exit_stuck_timeout=opts.exit_stuck_timeout,
        checks=NodeChecks(command=opts.health_check),
        max_restarts=opts.max_restarts,
        monitor_interval=opts.monitor_interval,
        role=opts.role,
        event_log_handler=opts.event_log_handler,
        virtual_local_rank=opts.virtual_local_rank,
        warm_start=opts.warm_start,
        checkpoint_every=opts.checkpoint_every,
        replace_stragglers=opts.replace_stragglers,
        preflight=opts.preflight,
    )


def _logs_specs(opts: RunOptions, redirects: Any, tee: Any, ranks_filter: Any) -> Any:
    """The torch LogsSpecs --logs-specs names (None: the built-in layout)."""
    return load_logs_specs(opts.logs_specs, opts.log_dir, redirects, tee, ranks_filter)
