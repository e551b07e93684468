"""One node's launch: a ``LaunchPlan`` (everything decided from the options, validated) and
``launch(plan)``, which runs it -- the local etcd for ``--standalone``, the etcd client, the
rendezvous handler and the agent -- and cleans up. The CLI builds the plan from its options; a
Python caller can build one too and call the same ``launch``."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.output.console import console_event, say
from launcher.reaper.handle import ReaperProcess, reaper_sys_path
from launcher.telemetry.metrics import Telemetry
from launcher.workers.env import exported
from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.endpoints import Endpoint
from rendezvous.etcd.target import EtcdTarget
from rendezvous.job.hangboard import HangChannel
from rendezvous.job.history import HistoryWriter
from rendezvous.job.keys import JobKeys
from rendezvous.job.paceboard import PaceBoard
from rendezvous.rounds.handler import RendezvousHandler
from rendezvous.settings import RendezvousSettings

from .agent import Agent
from .c10dstore import StoreHost
from .compose import Shared, node_parts
from .config import AgentConfig, JobTerms
from .errors import UsageError
from .hosted import Hosting, host_etcd, wait_alone
from .peers.probes import PeerProbes, PeerTerms
from .signals import PASSED_SIGNALS, STOP_SIGNALS, pass_to_workers, stop_on_signals
from .slurm.allocation import allocation_member
from .slurm.job import AllocationEtcd
from .torchft_lighthouse import Beside, lighthouse_beside
from .warmstart.interpreter import WarmStarter, warm_starter

if TYPE_CHECKING:
    from rendezvous.etcd.server import EtcdCluster

__all__ = ["LaunchPlan", "LaunchOutcome", "launch"]


@dataclass(frozen=True)
class LaunchPlan:
    """What one node runs, decided and validated before anything starts."""

    config: AgentConfig
    settings: RendezvousSettings
    etcd: EtcdTarget | None  # where etcd is and how to reach it; None: start a local one (--standalone)
    node_id: str
    local_addr: str | None = None
    signals: tuple[int, ...] = STOP_SIGNALS  # the signals that stop the agent (--signals-to-handle)
    exported: tuple[tuple[str, str], ...] = ()  # variables set in the agent's environment, which workers inherit
    log_root: str = ""
    remove_logs: bool = False  # the log root is a temporary directory with no file worth keeping
    notes: tuple[str, ...] = ()  # lines said once the plan stands (warnings torchrun also gives)
    http_host: str = "0.0.0.0"
    http_port: int | None = None  # the metrics and probes endpoint (--http-port); None: off
    allocation: AllocationEtcd | None = None  # under SLURM with no --rdzv-endpoint: the allocation's etcd
    lighthouse: Beside | None = None  # --lighthouse: a torchft Lighthouse replica beside the agent
    scratch: tuple[str, ...] = ()  # the caller's temporary directories: removed by the reaper if this process dies
    started: float | None = None  # when the agent started (epoch s; elastic-run: its process), for the goodput account
    hosting: Hosting | None = None  # a c10d line: the etcd at its endpoint, served by the agent on that host

    @property
    def standalone(self) -> bool:
        return self.etcd is None


@dataclass(frozen=True)
class LaunchOutcome:
    """A job this node finished: its exit code (0) and the global ranks its workers had last."""

    exit_code: int
    ranks: tuple[int, ...]


def launch(
    plan: LaunchPlan,
    *,
    early_etcd: EtcdCluster | None = None,
    early_warm: WarmStarter | None = None,
    report: Callable[[str], None] = say,
) -> LaunchOutcome:
    """Run the plan's agent to the end: the outcome when the job succeeded, else a LauncherError is raised.

    ``early_etcd`` is a local etcd already starting (``launcher.cli.main`` starts it before the heavy
    imports); it is used for a standalone plan, and stopped at the end either way. ``early_warm``:
    the workers' warm interpreter, started by ``launcher.cli.early`` as early; adopted here (or stopped,
    and another started: ``warm_starter``), handed to the agent, and stopped here at the end.
    """
    for line in plan.notes:
        report(line)
    server = warm = None
    try:
        with exported(dict(plan.exported)), stop_on_signals(plan.signals):
            # the workers' warm interpreter: the early one adopted, or stopped and another started (or none)
            warm, early_warm = warm_starter(plan.config, os.environ, report, early=early_warm), None
            target = plan.etcd
            if target is None:
                from rendezvous.etcd.server import EtcdServer, shipped_etcd, started_etcd

                server, early_etcd = (early_etcd.ready() if early_etcd is not None else EtcdServer().start()), None
                target = EtcdTarget.of(server.endpoints, timeout=plan.settings.read_timeout)  # it speaks http
                if server.binary_used != shipped_etcd():  # a newer etcd on PATH, or ELASTIC_ETCD_BINARY's
                    report(f"local etcd for this job: {started_etcd(server.binary_used)}")
            elif plan.hosting is not None:
                server = host_etcd(plan.hosting, report)  # None: another agent serves it
            with allocation_member(plan.allocation, report):
                client = EtcdClient(target)
                try:
                    with lighthouse_beside(plan.lighthouse, target, plan.settings.key_prefix, report):
                        return _run_agent(plan, client, report, _temporary(plan, server), warm, server is not None)
                finally:
                    client.close()
                    if plan.hosting is not None and server is not None:
                        _last_to_leave(plan, target, report)
    finally:
        for interpreter in (early_warm, warm):  # early_warm: never handed to warm_starter
            if interpreter is not None:
                interpreter.close()
        for unused in (early_etcd, server):
            if unused is not None:
                unused.stop()
        if plan.remove_logs:
            shutil.rmtree(plan.log_root, ignore_errors=True)


def _last_to_leave(plan: LaunchPlan, target: EtcdTarget, report: Callable[[str], None]) -> None:
    """The agent hosting a c10d line's etcd waits for the job's other agents to leave (bounded by
    the lease's TTL or the close timeout, whichever is longer: a dead agent's key lasts its lease).
    It asks its own etcd on a client of its own: the agent's client said its farewell."""
    keys = JobKeys(plan.settings.key_prefix, plan.settings.run_id)
    own = keys.node(plan.node_id).encode()

    with EtcdClient(target) as client:

        def others() -> int:
            try:
                return sum(kv.key != own for kv in client.get_prefix(keys.nodes, keys_only=True)[0])
            except RendezvousError:
                return 0

        wait_alone(others, max(plan.settings.lease_ttl, plan.settings.close_timeout), report)


def _temporary(plan: LaunchPlan, server: EtcdCluster | None) -> tuple[str, ...]:
    """The run's temporary directories, which its reaper removes if the agent is killed outright."""
    logs = (plan.log_root,) if plan.remove_logs else ()
    etcd = (server.data_dir,) if server is not None and not server.given_dir else ()
    return (*plan.scratch, *logs, *etcd)


def _run_agent(
    plan: LaunchPlan,
    client: EtcdClient,
    report: Callable[[str], None],
    temporary: tuple[str, ...] = (),
    warm: WarmStarter | None = None,
    own_etcd: bool = False,
) -> LaunchOutcome:
    """The agent and its collaborators: the job's history, the reaper, the rendezvous handler
    (``own_etcd``: the etcd was started here for the job)."""
    keys = JobKeys(plan.settings.key_prefix, plan.settings.run_id)
    echo = console_event if plan.config.event_log_handler == "console" else None
    history = HistoryWriter(client, keys.root, plan.node_id, report=report, echo=echo, started=plan.started)
    reaper = ReaperProcess()
    stores = StoreHost(plan.config.store_port, say=report) if plan.config.agent_store else None
    peers = paces = None
    try:
        peers = _peer_probes(plan, client, reaper, history, report)
        reaper.configure(client.target, reaper_sys_path(), history={"prefix": keys.root, "node": plan.node_id})
        for path in temporary:
            reaper.remove_at_exit(path)
        handler = _handler(plan, client, history, reaper, stores, peers, own_etcd=own_etcd)
        telemetry = _telemetry(plan, client, history)
        paces = PaceBoard(client, keys, plan.node_id)  # followed from the first round with timed work on
        shared = Shared(
            history, reaper, telemetry, report, HangChannel(client, keys, plan.node_id), stores, peers, paces, warm
        )
        terms = _terms(plan, handler)
        with node_parts(plan.config, handler, terms, shared) as parts:
            # its last words to etcd share one read_timeout: an allocation's etcd stopped with the
            # agents (scancel) costs one timeout, not one a call, and the grace period holds
            farewell = lambda: client.farewell(plan.settings.read_timeout)  # noqa: E731
            agent = Agent(plan.config, handler, terms, parts, shared, farewell=farewell)
            return _run(plan, agent, telemetry, report)
    finally:
        for helper in (stores, peers, paces):
            if helper is not None:
                helper.close()
        history.close()
        reaper.close()


def _handler(
    plan: LaunchPlan,
    client: EtcdClient,
    history: HistoryWriter,
    reaper: ReaperProcess,
    stores: StoreHost | None,
    peers: PeerProbes | None,
    own_etcd: bool,
) -> RendezvousHandler:
    """This node's rendezvous handler: its lease renewals arm the reaper's fence."""
    return RendezvousHandler(
        client,
        plan.settings,
        local_addr=plan.local_addr,
        local_world_size=plan.config.nproc_per_node,
        node_id=plan.node_id,
        max_restarts=plan.config.max_restarts,
        history=history,
        on_renew=reaper.arm,
        master_port=stores.port if stores is not None else None,
        probe=peers.endpoint if peers is not None else "",
        launched_at=plan.started,  # a closed job found by a later launch runs again
        own_etcd=own_etcd,  # started here for the job (--standalone, a c10d line's host): its version is not said
    )


def _terms(plan: LaunchPlan, handler: RendezvousHandler) -> JobTerms:
    """What the agent's parts need of the rendezvous: the lease view, and three of its settings."""
    settings = plan.settings
    nodes = (settings.min_nodes, settings.max_nodes)
    return JobTerms(handler.lease, settings.fence_after, settings.join_timeout, nodes)


def _run(plan: LaunchPlan, agent: Agent, telemetry: Telemetry, report: Callable[[str], None]) -> LaunchOutcome:
    """The agent's run, with its metrics and probes served and the signals it passes to its workers."""
    server = _serve(plan, agent, telemetry, report)
    try:
        passed = tuple(s for s in PASSED_SIGNALS if s not in plan.signals)
        with pass_to_workers(passed, agent.worker_pids, report):
            code = agent.run()
    finally:
        if server is not None:
            server.close()
    base = agent.info.base_global_rank if agent.info is not None else 0
    return LaunchOutcome(code, tuple(range(base, base + plan.config.nproc_per_node)))


def _peer_probes(
    plan: LaunchPlan, client: EtcdClient, reaper: ReaperProcess, history: HistoryWriter, report: Callable[[str], None]
) -> PeerProbes | None:
    """This node's probes of its peers (None: peer_timeout=0, or a job of one node at most)."""
    settings = plan.settings
    if settings.peer_window <= 0 or settings.max_nodes < 2:
        return None
    try:
        addr = plan.local_addr or socket.getfqdn()
        return PeerProbes(PeerTerms.of(settings), client, plan.node_id, addr, reaper.contact, history, report)
    except OSError as exc:
        raise UsageError(
            f"--rdzv-conf probe_port={settings.probe_port}: cannot listen ({exc.strerror or exc})"
        ) from None


def _telemetry(plan: LaunchPlan, client: EtcdClient, history: HistoryWriter) -> Telemetry:
    """Prometheus metrics when the endpoint is on (prometheus-client is imported only then)."""
    if plan.http_port is None:
        return Telemetry()
    from launcher.telemetry.metrics import PrometheusTelemetry

    telemetry = PrometheusTelemetry(plan.settings.run_id, plan.node_id, max_restarts=plan.config.max_restarts)
    client.observer = telemetry.etcd_call
    history.on_failure = telemetry.history_failed
    return telemetry


def _serve(plan: LaunchPlan, agent: Agent, telemetry: Telemetry, report: Callable[[str], None]):
    if plan.http_port is None:
        return None
    from launcher.telemetry.httpserver import ProbeServer

    try:
        server = ProbeServer(plan.http_host, plan.http_port, agent.snapshot, telemetry.registry)
    except OSError as exc:
        raise UsageError(
            f"--http-port {plan.http_port}: cannot listen on {plan.http_host}:{plan.http_port} ({exc.strerror or exc})"
        ) from None
    report(f"metrics and probes on http://{Endpoint(plan.http_host, server.port).target} (/metrics, /healthz, /readyz)")
    return server
