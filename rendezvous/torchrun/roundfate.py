"""What became of the round a torchrun node's workers run in -- the rule that ends a node's waits
once its rendezvous is closed or abandoned, for the ``etcd-v3`` handler (``plugin.JobHandler``).

torch's agent asks its handler one question while the workers are healthy: how many nodes wait
(``num_nodes_waiting``, once a monitor interval). Nothing in that question ends a node whose peers
are gone. On torch's c10d backend a node often ends anyway, because the store it waits on lived in
a process that died; on etcd the store outlives every agent, so a node whose workers wait in
``init_process_group`` for ranks that will never come waits for the whole init timeout (30
minutes). The handler answers from the state it has just read (torch caches it for a second):

- **closed** -- another node's agent shut the rendezvous down while this node's workers ran: it
  gave up after its restarts, failed, or finished past its exit barrier. Nothing can join this run
  any more, so this node ends too, with torch's ``RendezvousClosedError``.
- **abandoned** -- a participant of this node's round was dropped by torch's own rule for a dead
  node (no heartbeat for ``keep_alive_interval * keep_alive_max_attempt``: torch then forgets its
  heartbeat too, which a node that only left to rejoin keeps), or the round moved on without this
  node. The round cannot complete a collective again, so this node asks its agent for
  a new round, as when a node waits: membership changes do not count as restarts in torch's agent.

A state that cannot be read decides nothing.
"""

from __future__ import annotations

import enum

from .torchstate import TorchNode, TorchState

__all__ = ["Fate", "fate", "lost_nodes"]


class Fate(enum.Enum):
    CLOSED = "closed"
    ABANDONED = "abandoned"


def _who(node: TorchNode) -> tuple[str, int, int]:
    return node.addr, node.pid, node.local_id


def lost_nodes(formed: TorchState, now: TorchState) -> list[TorchNode]:
    """The participants of ``formed``'s round that torch dropped as dead by ``now`` -- no longer a
    participant, and no heartbeat of it kept (a node that left the round to join the next one, as
    torch's agent does before every restart, keeps its heartbeat) -- or all of them once the round
    moved on."""
    if now.round != formed.round:
        return list(formed.participants)
    present = {_who(node) for node in (*now.participants, *now.beating)}
    return [node for node in formed.participants if _who(node) not in present]


def fate(formed: TorchState | None, now: TorchState | None) -> Fate | None:
    """``formed``: the state as this node's round formed; ``now``: the newest read (None: unreadable)."""
    if now is None:
        return None
    if now.closed:
        return Fate.CLOSED
    if formed is not None and formed.complete and lost_nodes(formed, now):
        return Fate.ABANDONED
    return None
