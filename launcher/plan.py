"""One node's run, typed: ``RunRequest`` holds every value already parsed (elastic-run's options,
``launcher.cli.parse``; or the Python API's ``LaunchConfig``, ``launcher.api``), and ``build_plan``
turns it into the ``LaunchPlan`` that ``launcher.launch.launch`` runs: the job's identity, its
rendezvous settings, this node's id and log root, the agent's config and the lines to say first.

Nothing here reads text given by a user except the rendezvous settings (``--rdzv-conf`` keys, as
text in both paths so that both check them alike) and the environment variables torchrun also reads.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from launcher import envnames
from launcher.config import AgentConfig
from launcher.errors import UsageError
from launcher.hangs.hangrules import HangTimeouts
from launcher.hosted import Hosting
from launcher.launch import LaunchPlan
from launcher.output import DefaultLayout, TorchLogsSpecsLayout
from launcher.output.console import say
from launcher.output.streams import Std
from launcher.slurm.job import AllocationEtcd
from launcher.torchft_lighthouse import Beside
from launcher.workers.env import OMP_WARNING, virtual_device
from launcher.workers.numa import binding_commands
from rendezvous.job.keys import JobKeys
from rendezvous.rounds.member import default_node_id
from rendezvous.settings import RendezvousSettings

__all__ = ["RunRequest", "build_plan", "hang_timeouts", "STOP_SIGNALS_TEXT"]

STOP_SIGNALS_TEXT = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle default


@dataclass(frozen=True)
class RunRequest:
    """What one node runs, every value parsed and checked where it was given: the agent's config as
    the parsers made it, and what the plan derives the rest from."""

    agent: AgentConfig  # the agent's settings (the plan adds its layout, binding, checks, history)
    min_nodes: int = 1
    max_nodes: int = 1
    endpoint: str | None = None  # etcd's host:port[,...]; None: a local etcd for this node alone (--standalone)
    run_id: str | None = None  # required with an endpoint; --standalone makes one
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)  # --rdzv-conf keys and their text
    log_dir: str | None = None  # None: a temporary directory, removed at the end unless it holds log files
    redirects: dict[int, int] | int = Std.NONE
    tee: dict[int, int] | int = Std.NONE
    ranks_filter: set[int] | None = None
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()
    logs_specs: Any = None  # a torch LogsSpecs instance: it decides where the output goes
    log_line_prefix_template: str | None = None  # else $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, as torchrun
    local_addr: str | None = None
    signals: tuple[int, ...] = ()  # the signals that stop the agent
    signals_to_handle: str = STOP_SIGNALS_TEXT  # as given: exported to the workers as torchrun does
    numa_binding: str | None = None  # --numa-binding's mode (None: no binding)
    http_port: int | None = None
    http_host: str = "0.0.0.0"
    lighthouse: Beside | None = None
    allocation: AllocationEtcd | None = None  # under SLURM with no --rdzv-endpoint: the allocation's etcd
    node_name: str | None = None  # under SLURM: the node's name, which this node's id starts with
    scratch: tuple[str, ...] = ()  # the caller's temporary directories: removed by the reaper if this process dies
    hosting: Hosting | None = None  # a c10d line: its etcd is served by the agent on the endpoint's host


def build_plan(request: RunRequest) -> LaunchPlan:
    """The request as a LaunchPlan, ready to launch (a UsageError names what cannot be done)."""
    min_nodes, max_nodes, run_id = _identity(request)
    nproc = request.agent.nproc_per_node
    if request.agent.virtual_local_rank:
        _check_virtual_devices(nproc)
    cpu_binding, numa_line = binding_commands(request.numa_binding, nproc)
    settings = RendezvousSettings.from_conf(run_id, min_nodes, max_nodes, dict(request.rdzv_conf), warn=say)
    etcd = settings.target(request.endpoint) if request.endpoint is not None else None
    history = JobKeys(settings.key_prefix, run_id).ctl("history", request.endpoint) if _etcd_outlives(request) else ""
    # everything is checked: now the node's id and its log directory (made here)
    node_id = default_node_id() if request.node_name is None else f"{request.node_name}-{uuid.uuid4().hex[:6]}"
    log_root, temporary = _log_root(request.log_dir, run_id, node_id)
    keep_files = bool(request.redirects or request.tee)
    notes = _notes(request, numa_line, log_root if temporary and keep_files else None)
    return LaunchPlan(
        _agent_config(request, log_root, history, cpu_binding),
        settings,
        etcd,
        node_id,
        local_addr=request.local_addr or ("127.0.0.1" if request.endpoint is None else None),
        signals=request.signals,
        exported=((envnames.SIGNALS_TO_HANDLE, request.signals_to_handle),),
        log_root=log_root,
        remove_logs=temporary and not keep_files,
        notes=notes,
        http_host=request.http_host or "0.0.0.0",
        http_port=request.http_port,
        allocation=request.allocation,
        lighthouse=request.lighthouse,
        scratch=request.scratch,
        hosting=request.hosting,
    )


def hang_timeouts(first: float | None, steady: float | None) -> HangTimeouts:
    """--first-heartbeat-timeout and --heartbeat-timeout (LaunchConfig's fields of the same names):
    900 s for the first heartbeat unless given; a bad pair is a UsageError naming it."""
    try:
        return HangTimeouts(first=900.0 if first is None else first, steady=steady, judge_first=first is not None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _identity(request: RunRequest) -> tuple[int, int, str]:
    """(min nodes, max nodes, the job id): one node and a fresh id for --standalone; else both required."""
    if request.endpoint is None:
        return 1, 1, f"standalone-{uuid.uuid4().hex[:12]}"
    if not request.endpoint:
        raise UsageError("--rdzv-endpoint is required (host:port of etcd), or use --standalone")
    if not request.run_id:
        raise UsageError("--rdzv-id is required: the same job id on every node")
    return request.min_nodes, request.max_nodes, request.run_id


def _notes(request: RunRequest, numa_line: str | None, temporary_logs: str | None) -> tuple[str, ...]:
    """torchrun's warnings about the run (OMP_NUM_THREADS), the NUMA binding, where the logs go."""
    notes = [OMP_WARNING] if request.agent.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ else []
    notes += [numa_line] if numa_line else []
    notes += [f"log files go to {temporary_logs} (set --log-dir to choose)"] if temporary_logs else []
    return tuple(notes)


def _etcd_outlives(request: RunRequest) -> bool:
    """Whether the job's etcd outlives this agent, so that a command naming it can be pasted later:
    not a local one (--standalone), the etcd of a SLURM allocation, nor one a c10d line's agent hosts."""
    return bool(request.endpoint) and request.allocation is None and request.hosting is None


def _agent_config(
    request: RunRequest, log_root: str, history_command: str, cpu_binding: Mapping[int, tuple[str, ...]]
) -> AgentConfig:
    """The parsers' config with what the plan derives added."""
    agent = request.agent
    return replace(
        agent,
        logs=_output_layout(request, log_root),
        cpu_binding=cpu_binding,
        checks=agent.checks.for_node((log_root, agent.checkpoint_dir or "")),
        checkpoint_dir=os.path.abspath(agent.checkpoint_dir) if agent.checkpoint_dir else None,
        agent_store=os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1",  # torchrun's opt-out
        history_command=history_command,
    )


def _output_layout(request: RunRequest, log_root: str):
    """The output strategy: the torch LogsSpecs given, else the built-in layout under ``log_root``."""
    template = request.log_line_prefix_template or os.environ.get(envnames.LOG_LINE_PREFIX_TEMPLATE) or None
    filters = request.stdout_filters, request.stderr_filters
    if request.logs_specs is not None:
        return TorchLogsSpecsLayout(request.logs_specs, template, *filters)
    return DefaultLayout(log_root, request.redirects, request.tee, request.ranks_filter, template, *filters)


def _check_virtual_devices(nproc: int) -> None:
    """--virtual-local-rank: the last local rank has a device, so every one has (the rule workers are started by)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        virtual_device(nproc - 1, visible)
    except ValueError:
        raise UsageError(
            f"--virtual-local-rank: CUDA_VISIBLE_DEVICES={visible} names fewer devices than --nproc-per-node {nproc}"
        ) from None


def _log_root(log_dir: str | None, run_id: str, node_id: str) -> tuple[str, bool]:
    if log_dir is None:
        return tempfile.mkdtemp(prefix=f"elastic-{run_id}-"), True
    root = os.path.join(log_dir, run_id, node_id)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-dir {log_dir!r} cannot be used: {exc.strerror}") from None
    return root, False
