"""The agent's parts, built once where the agent is built (``launch`` is the composition root, and
this module its half that makes what one node's agent runs with): the worker group and how it
starts its workers, the health gate, the checkpoint keeper, the round runner, and the workers'
environment -- one read-only value, built here, that no part writes to or reads back.

Everything here lives as long as the agent and is closed here, after the agent's run: the agent
only uses it (``Agent`` constructs per-round values alone). What the parts share comes in from the
root already built (the handler, history, reaper, telemetry, peers, the warm interpreter), owned
and closed there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

from launcher.inprocess.host import InprocessHost
from launcher.inprocess.keeper import Keeper
from launcher.reaper.handle import ReaperProcess
from launcher.telemetry.metrics import Telemetry
from launcher.warmstart.interpreter import WarmStarter
from launcher.warmstart.starters import starter_for
from launcher.workers.checkpoints import CheckpointKeeper, memory_dir
from launcher.workers.group import WorkerGroup
from rendezvous.job.hangboard import HangChannel
from rendezvous.job.history import HistoryWriter
from rendezvous.job.paceboard import PaceBoard
from rendezvous.rounds.handler import RendezvousHandler

from .c10dstore import StoreHost
from .config import AgentConfig, JobTerms
from .nodecheck import HealthGate
from .output import LogPump
from .peers.probes import PeerProbes
from .preflight.gate import preflight_for
from .runner import RoundRunner

__all__ = ["Shared", "NodeParts", "node_parts", "workers_environ"]


@dataclass(frozen=True)
class Shared:
    """What the root built for the whole node, that the agent's parts use too (owned by the root)."""

    history: HistoryWriter
    reaper: ReaperProcess
    telemetry: Telemetry
    say: Callable[[str], None]
    hangs: HangChannel | None = None  # etcd's side of hang detection (None: no hang watch)
    stores: StoreHost | None = None  # the round's c10d store's sockets (None: rank 0's worker hosts it)
    peers: PeerProbes | None = None  # this node's probes of its peers (None: leases only)
    paces: PaceBoard | None = None  # the nodes' own-work paces (None: ranks compared locally)
    warm: WarmStarter | None = None  # the interpreter workers are forked from (None: plain starts)


@dataclass(frozen=True)
class NodeParts:
    """The agent's parts, for as long as it runs."""

    environ: Mapping[str, str]  # the workers' environment before a round's own names (read-only)
    group: WorkerGroup
    gate: HealthGate
    checkpoints: CheckpointKeeper
    rounds: RoundRunner


def workers_environ(base: Mapping[str, str], *parts: Mapping[str, str]) -> Mapping[str, str]:
    """The workers' environment: ``base`` (the agent's own) with each part's names over it, read-only."""
    merged = dict(base)
    for names in parts:
        merged.update(names)
    return MappingProxyType(merged)


@contextmanager
def node_parts(
    config: AgentConfig,
    handler: RendezvousHandler,
    terms: JobTerms,
    shared: Shared,
    base: Mapping[str, str] | None = None,
) -> Iterator[NodeParts]:
    """Build the agent's parts, hand them over, and close them once the agent is done with them.
    ``base``: the environment the workers' starts from (this process's by default)."""
    pump, beats = LogPump(), memory_dir("elastic-beats-")
    shared.reaper.remove_at_exit(beats)  # nothing left behind if the agent is killed outright
    inprocess = InprocessHost(beats)  # workers under elastic.inprocess call in
    checkpoints = CheckpointKeeper(config.checkpoint_dir, config.checkpoint_every)
    shared.reaper.remove_at_exit(checkpoints.memory)
    environ = workers_environ(os.environ if base is None else base, inprocess.env(), checkpoints.env())
    gate = None
    try:
        start = starter_for(shared.warm, config.argv)  # forked from the warm interpreter, or plain
        group = WorkerGroup(config.argv, pump, shared.reaper, starter=start, keeper=Keeper(inprocess))
        gate = HealthGate.for_agent(
            config.checks, environ, shared.say, shared.history.record, handler, shared.telemetry, terms.join_timeout
        )
        rounds = RoundRunner(
            config.round_settings(),
            beats,
            handler,
            terms,
            group,
            shared.reaper,
            history=shared.history,
            say=shared.say,
            telemetry=shared.telemetry,
            hangs=shared.hangs,
            environ=environ,
            stores=shared.stores,
            peers=shared.peers,
            paces=shared.paces,
            preflight=preflight_for(config.preflight, shared.warm, shared.say),
            memory=checkpoints.memory,
        )
        yield NodeParts(environ, group, gate, checkpoints, rounds)
    finally:
        for helper in (pump, inprocess, gate):
            if helper is not None:
                helper.close()
        shutil.rmtree(beats, ignore_errors=True)
        checkpoints.close()  # the newest saves to --checkpoint-dir, the memory freed
