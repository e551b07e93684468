"""What an agent is told to run: one node's settings, decided by the CLI or the launch API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.hangs.hangrules import HangTimeouts
from launcher.nodecheck import NodeChecks
from rendezvous.rounds.join import RendezvousInfo
from rendezvous.rounds.member import LeaseStatus

from .output import LayoutStrategy

__all__ = ["AgentConfig", "RoundSettings", "JobTerms", "differences"]


@dataclass(frozen=True)
class CrashLoop:
    """The crash-loop breaker: the job closes (exit 5) at ``restarts`` restarts in a row with no
    progress, a round counting as progress when it ran at least ``window`` seconds."""

    restarts: int = 3  # --crash-loop-restarts (0: never)
    window: float = 300.0  # --progress-window


@dataclass(frozen=True)
class AgentConfig:
    """The agent's settings: made by the option parsers (``launcher.cli.parse``, ``launcher.api``)
    from what was given; ``launcher.plan.build_plan`` adds what it derives (the output layout, CPU
    binding, the node's checked directories, the history command) and nothing else."""

    argv: tuple[str, ...]  # the worker command line
    nproc_per_node: int
    logs: LayoutStrategy | None = None  # the built-in layout or a torch LogsSpecs (the plan's)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = "default"
    stop_grace: float = 30.0  # seconds between SIGTERM and SIGKILL when stopping workers (--shutdown-timeout)
    virtual_local_rank: bool = False  # LOCAL_RANK=0 and one CUDA device per worker
    event_log_handler: str = "null"  # torchrun's --event-log-handler: null, or console (a JSON line per event)
    cpu_binding: Mapping[int, tuple[str, ...]] = field(
        default_factory=dict
    )  # command before a local rank's (--numa-binding)
    exit_barrier_timeout: float = 300.0  # how long a finished node waits for the others (--exit-barrier-timeout)
    exit_stuck_timeout: float = 60.0  # a worker doing nothing this long after the others exited 0 is ended (0: never)
    hang_timeouts: HangTimeouts = field(default_factory=HangTimeouts)  # --heartbeat-timeout, --first-heartbeat-timeout
    history_command: str = ""  # the pasteable elastic-ctl history of the job ("": its etcd ends with the agent)
    warm_start: bool = True  # fork Python workers from a warm interpreter (--no-warm-start: fresh processes)
    preload: tuple[str, ...] = ()  # modules it imports besides torch's (--preload)
    agent_store: bool = True  # group rank 0's agent hosts the c10d store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: not)
    store_port: int | None = None  # its port (--master-port); None: a free port each round
    checkpoint_dir: str | None = None  # where elastic.checkpoint saves are copied (--checkpoint-dir); None: memory only
    checkpoint_every: int = 10  # a copy there every so many saves of a rank (--checkpoint-every)
    crash_loop: CrashLoop = CrashLoop()  # --crash-loop-restarts, --progress-window
    checks: NodeChecks = NodeChecks()  # the health gate before this node takes a rank (--health-check)
    replace_stragglers: bool = False  # a straggler's node steps out when a spare waits (--replace-stragglers)
    preflight: bool = False  # the nodes checked in pairs before a round with a new node (--preflight)

    def round_settings(self) -> "RoundSettings":
        fields = ("nproc_per_node", "role", "virtual_local_rank", "monitor_interval", "stop_grace", "cpu_binding")
        fields += ("exit_stuck_timeout",)
        fields += ("hang_timeouts", "replace_stragglers")
        return RoundSettings(**{name: getattr(self, name) for name in fields})


@dataclass(frozen=True)
class RoundSettings:
    """What the round runner needs of the agent's settings (``AgentConfig.round_settings``)."""

    nproc_per_node: int
    role: str
    virtual_local_rank: bool
    monitor_interval: float
    stop_grace: float
    cpu_binding: Mapping[int, tuple[str, ...]]
    exit_stuck_timeout: float
    hang_timeouts: HangTimeouts
    replace_stragglers: bool


def differences(config: AgentConfig, nodes: tuple[int, int], info: RendezvousInfo) -> tuple[str, ...]:
    """One line for each of this node's options that differ from the job's (the first agent's, which
    the job follows): --nnodes (``nodes``: this node's MIN, MAX), --max-restarts, and
    --nproc-per-node when the round's world is not this node's count times its nodes."""
    lines = []
    if info.max_nodes and (info.min_nodes, info.max_nodes) != tuple(nodes):
        mine, job = _nnodes(*nodes), _nnodes(info.min_nodes, info.max_nodes)
        lines.append(f"--nnodes {mine} differs from the job's {job} (its coordinator's); the rounds follow the job's")
    if info.max_restarts != config.max_restarts:
        lines.append(
            f"--max-restarts {config.max_restarts} differs from the job's {info.max_restarts} "
            "(the first agent's); following the job's"
        )
    if info.world_size != info.group_world_size * config.nproc_per_node:
        lines.append(
            f"--nproc-per-node {config.nproc_per_node} differs from other nodes': the job runs "
            f"{info.world_size} workers on {info.group_world_size} nodes"
        )
    return tuple(lines)


def _nnodes(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}:{high}"


@dataclass(frozen=True)
class JobTerms:
    """What the agent's parts need of the job's rendezvous, handed to them by the root (``launch``):
    this node's lease as the fence sees it, and three settings. No part reads them through the
    handler."""

    lease: LeaseStatus
    fence_after: float  # seconds without a renewal after which the workers are stopped
    join_timeout: float  # seconds a round may take to form
    nodes: tuple[int, int]  # the job's --nnodes (min, max), as this node's settings have it
