"""Launching from Python with torch's shape: ``LaunchConfig`` and ``elastic_launch``.

    from .api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts=1)
    results = elastic_launch(config, train)(lr)    # {global rank: train(lr)} of this node's ranks

The fields, their defaults and meanings are torch 2.13's (torch/distributed/launcher/api.py) where
they apply. The launch is elastic-run's own: the same typed request and plan (``launcher.plan``,
built here from the config's values, no text in between) and the same ``launcher.launch.launch``
-- rendezvous on etcd v3, the job's restart count, fencing, the reaper, history and output rules.
``rdzv_backend`` ``etcd``, ``etcd-v2`` and ``etcd-v3`` all mean this project's etcd v3 rendezvous;
``c10d`` runs it on an etcd that the agent on the endpoint's host serves (``launcher.hosted``), so
torch's c10d configs run unchanged; an empty ``rdzv_endpoint`` with one node (or a c10d endpoint on
port 0) starts a local etcd, as ``--standalone`` does.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ChildFailedError, UsageError, WorkerFailedError
from .options.table import check_field
from .workers.mainguard import unguarded_launch
from .workers.payload import dump_payload, name_of

if TYPE_CHECKING:
    from .config import AgentConfig
    from .hosted import Hosting
    from .plan import RunRequest

__all__ = ["LaunchConfig", "elastic_launch", "launch_agent"]

BACKENDS = ("etcd", "etcd-v2", "etcd-v3", "c10d")
_OPTION_FIELDS = (
    "max_restarts",
    "monitor_interval",
    "checkpoint_every",
    "heartbeat_timeout",
    "first_heartbeat_timeout",
    "crash_loop_restarts",
    "progress_window",
    "exit_barrier_timeout",
    "exit_stuck_timeout",
)
START_METHODS = ("spawn", "fork", "forkserver")


@dataclass
class LaunchConfig:
    """torch's LaunchConfig. Accepted with no effect here: ``start_method`` (workers are always fresh
    processes: spawn), ``metrics_cfg``, ``numa_options`` (use ``elastic-run --numa-binding``)."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: Any = None  # a torch LogsSpecs; None: the built-in layout (torch's DefaultLogsSpecs rules)
    run_id: str = ""  # "": a random id, with a warning, as torch (several nodes must share one)
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1  # legacy: rdzv_configs["timeout"]
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    numa_options: Any = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    shutdown_timeout: int | None = None
    # ours, beside torch's fields: elastic-run's --heartbeat-timeout and --first-heartbeat-timeout (README "Hangs")
    heartbeat_timeout: float | None = None
    first_heartbeat_timeout: float | None = None
    # and --checkpoint-dir / --checkpoint-every (README "State kept in memory")
    checkpoint_dir: str | None = None
    checkpoint_every: int = 10
    # and the gray-failure options (README "Gray failures"): --crash-loop-restarts, --progress-window,
    # --health-check, --replace-stragglers, --preflight
    crash_loop_restarts: int = 3
    progress_window: float = 300.0
    health_check: str = ""
    replace_stragglers: bool = False
    preflight: bool = False
    # and the endings' bounds (docs "Every run ends"): --exit-barrier-timeout, --exit-stuck-timeout
    exit_barrier_timeout: float = 300.0
    exit_stuck_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.rdzv_timeout != -1:
            self.rdzv_configs["timeout"] = self.rdzv_timeout
        elif "timeout" not in self.rdzv_configs:
            self.rdzv_configs["timeout"] = 900
        if self.shutdown_timeout is None:
            self.shutdown_timeout = int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        _validate(self)


def _validate(config: LaunchConfig) -> None:
    """One ValueError naming the first field that is wrong."""

    def whole(name: str, minimum: int) -> int:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"LaunchConfig.{name} must be an integer >= {minimum}, not {value!r}")
        return value

    if whole("max_nodes", 1) < whole("min_nodes", 1):
        raise ValueError(f"LaunchConfig.min_nodes ({config.min_nodes}) is more than max_nodes ({config.max_nodes})")
    whole("nproc_per_node", 1)
    whole("shutdown_timeout", 0)
    for name in _OPTION_FIELDS:  # the fields that are elastic-run's options too: the option table's checks
        check_field(name, getattr(config, name))
    if str(config.rdzv_backend).lower() not in BACKENDS:
        raise ValueError(
            f"LaunchConfig.rdzv_backend must be one of {', '.join(BACKENDS)} (etcd v3 here; c10d on an etcd it hosts), "
            f"not {config.rdzv_backend!r}"
        )
    if config.start_method not in START_METHODS:
        raise ValueError(
            f"LaunchConfig.start_method must be one of {', '.join(START_METHODS)}, not {config.start_method!r}"
        )
    if not config.rdzv_endpoint and config.max_nodes > 1:
        raise ValueError("LaunchConfig.rdzv_endpoint is required for more than one node (host:port of etcd)")
    if not isinstance(config.rdzv_configs, dict):
        raise ValueError(f"LaunchConfig.rdzv_configs must be a dict, not {type(config.rdzv_configs).__name__}")
    if not config.role:
        raise ValueError("LaunchConfig.role must not be empty")
    if not isinstance(config.health_check, str):
        raise ValueError(f"LaunchConfig.health_check must be a shell command (a str), not {config.health_check!r}")


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)``: run ``entrypoint`` on this node as one agent of
    the job; returns ``{global rank: return value}`` for this node's ranks (None for a command).

    ``entrypoint`` is a function (each worker calls it with ``args`` in a fresh process) or a command
    (``sys.executable``, a script, a binary: each worker runs it with ``args``). A job that fails
    raises ChildFailedError naming the first failed rank, its exit code and its traceback.
    """

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str) -> None:
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args))


def launch_agent(config: LaunchConfig, entrypoint: Callable[..., Any] | str, args: list[Any]) -> dict[int, Any]:
    """What ``elastic_launch(config, entrypoint)(*args)`` does."""
    from .launch import launch
    from .plan import build_plan

    if not callable(entrypoint) and not isinstance(entrypoint, str):
        raise ValueError(f"the entrypoint must be a function or a command, not {type(entrypoint).__name__}")
    unguarded = unguarded_launch(entrypoint)
    if unguarded is not None:
        raise ValueError(unguarded)
    work = tempfile.mkdtemp(prefix="elastic-launch-")
    try:
        argv = _worker_command(entrypoint, args, work)
        request = _request(config, argv, scratch=work)
        plan = build_plan(request)
        try:
            outcome = launch(plan)
        except WorkerFailedError as exc:
            raise ChildFailedError(_name(entrypoint), exc.failures, str(exc)) from None
        if callable(entrypoint):
            return {rank: _result(work, rank) for rank in outcome.ranks}
        return dict.fromkeys(outcome.ranks)
    except UsageError as exc:
        raise ValueError(f"LaunchConfig: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _worker_command(entrypoint: Callable[..., Any] | str, args: list[Any], work: str) -> list[str]:
    if isinstance(entrypoint, str):
        return [entrypoint, *map(str, args)]
    from multiprocessing import spawn

    payload = os.path.join(work, "payload.pkl")
    preparation = spawn.get_preparation_data("elastic-worker")
    preparation.pop("authkey", None)  # the caller's multiprocessing key: not for its workers (nor picklable)
    if not os.path.isfile(preparation.get("init_main_from_path") or ""):
        preparation.pop("init_main_from_path", None)  # a caller run from stdin or -c has no main file to re-import
    with open(payload, "wb") as handle:
        dump_payload(handle, preparation, entrypoint, tuple(args))
    return [sys.executable, "-u", "-m", "launcher.workers.fn_worker", payload, work]


def _request(config: LaunchConfig, argv: list[str], scratch: str) -> RunRequest:
    """The config as the typed request elastic-run's options also come to: the worker command runs
    as --no-python does; no rdzv_endpoint (one node) is a local etcd, as --standalone."""
    from .plan import RunRequest
    from .signals import parse_signals

    hosting = _hosting(config)
    standalone = not config.rdzv_endpoint or (hosting is not None and hosting.port == 0)
    if standalone:
        hosting = None
    return RunRequest(
        agent=_agent_config(config, tuple(argv)),
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        endpoint=None if standalone else hosting.endpoint if hosting is not None else config.rdzv_endpoint,
        run_id=None if standalone else config.run_id or _random_run_id(),
        hosting=hosting,
        rdzv_conf={key: str(value) for key, value in config.rdzv_configs.items()},  # checked as --rdzv-conf is
        stdout_filters=tuple(config.duplicate_stdout_filters or ()),
        stderr_filters=tuple(config.duplicate_stderr_filters or ()),
        logs_specs=config.logs_specs,
        log_line_prefix_template=config.log_line_prefix_template,
        local_addr=config.local_addr,
        signals=parse_signals(config.signals_to_handle),
        signals_to_handle=config.signals_to_handle,
        scratch=(scratch,),
    )


def _hosting(config: LaunchConfig) -> Hosting | None:
    """A c10d config's endpoint (``launcher.hosted``); port 0, a free port, for one node only."""
    if str(config.rdzv_backend).lower() != "c10d" or not config.rdzv_endpoint:
        return None
    from .hosted import alone_on_port_0, c10d_endpoint

    is_host = config.rdzv_configs.get("is_host")
    try:
        hosting = c10d_endpoint(config.rdzv_endpoint, None if is_host is None else str(is_host), free_port=True)
        alone_on_port_0(hosting, config.max_nodes)  # port 0 for more nodes: refused, as on the command line
    except UsageError as exc:
        raise ValueError(f"LaunchConfig: {exc}") from None
    return hosting


def _agent_config(config: LaunchConfig, argv: tuple[str, ...]) -> AgentConfig:
    """The agent's settings from the config's fields, as elastic-run's parsers make them from its options."""
    from .config import AgentConfig, CrashLoop
    from .nodecheck import NodeChecks
    from .plan import hang_timeouts

    return AgentConfig(
        argv=argv,
        nproc_per_node=config.nproc_per_node,
        max_restarts=config.max_restarts,
        monitor_interval=float(config.monitor_interval),
        role=config.role,
        event_log_handler=config.event_log_handler,
        stop_grace=float(config.shutdown_timeout),
        hang_timeouts=hang_timeouts(config.first_heartbeat_timeout, config.heartbeat_timeout),
        virtual_local_rank=config.virtual_local_rank,
        preload=_preload_like_the_caller(),
        checkpoint_dir=config.checkpoint_dir or None,
        checkpoint_every=config.checkpoint_every,
        crash_loop=CrashLoop(config.crash_loop_restarts, float(config.progress_window)),
        exit_barrier_timeout=float(config.exit_barrier_timeout),
        exit_stuck_timeout=float(config.exit_stuck_timeout),
        checks=NodeChecks(command=config.health_check),
        replace_stragglers=bool(config.replace_stragglers),
        preflight=bool(config.preflight),
    )


def _preload_like_the_caller() -> tuple[str, ...]:
    """What the warm interpreter imports for function workers: what the caller has imported of
    torch and numpy (the function's module is imported by reference; its source is not read)."""
    from .warmstart.interpreter import preload_for

    return preload_for(name for name in ("torch", "numpy") if name in sys.modules)


def _random_run_id() -> str:
    """torch's answer to a LaunchConfig with no run_id: a random one, and a warning (every node then
    makes its own, so a job of several nodes needs the same run_id given to each)."""
    from .output.console import say

    run_id = str(uuid.uuid4().int)
    say(f"config has no run_id, generated a random run_id: {run_id}")
    return run_id


def _result(work: str, rank: int) -> Any:
    with open(os.path.join(work, f"{rank}.pkl"), "rb") as handle:
        return pickle.load(handle)  # written by this launch's own worker, never read from etcd


def _name(entrypoint: Callable[..., Any] | str) -> str:
    return entrypoint if isinstance(entrypoint, str) else name_of(entrypoint)
