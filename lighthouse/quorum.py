"""When a quorum forms, who is in it, and which id it gets: torchft 0.2.0's Lighthouse rules, as pure
functions of what the replica that forms quorums knows (no clock, no I/O).

- Healthy: a replica group heard (a heartbeat or a quorum request) within the heartbeat timeout.
- Candidates: the healthy groups that asked for the quorum being formed, in replica id order.
- Fast path: when every member of the previous quorum asked again, the candidates form the quorum
  at once (with ``shrink_only`` asked by any of them: only the previous members).
- Otherwise: at least ``min_replicas`` candidates; more than half of the healthy groups (two
  halves of a partition cannot both have a quorum); and every healthy group asked, or the join
  timeout passed since the first of the candidates asked.
- The id: the previous one + 1 when the members changed (by replica id) or a member reports commit
  failures; the previous one otherwise. It never goes back (the caller keeps it in etcd).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["Rules", "Asked", "Decision", "healthy", "decide", "next_id"]


@dataclass(frozen=True)
class Rules:
    """``elastic-lighthouse``'s flags, in seconds (torchft's defaults)."""

    min_replicas: int
    join_timeout: float = 60.0
    heartbeat_timeout: float = 5.0
    quorum_tick: float = 0.1


@dataclass(frozen=True)
class Asked:
    """A replica group's request for the quorum being formed."""

    replica_id: str
    joined: float  # when it asked (the clock of the one who decides)
    shrink_only: bool = False
    commit_failures: int = 0


@dataclass(frozen=True)
class Decision:
    """``members`` in replica id order (None: no quorum yet), the state in words, and whether it is
    the fast path (every previous member asked again)."""

    members: tuple[str, ...] | None
    reason: str
    fast: bool = False


def healthy(heard: Mapping[str, float], now: float, timeout: float) -> frozenset[str]:
    """The replica groups heard within ``timeout`` of ``now``."""
    return frozenset(rid for rid, at in heard.items() if now - at < timeout)


def decide(
    now: float,
    asked: Mapping[str, Asked],
    heard: Mapping[str, float],
    previous: Collection[str] | None,
    rules: Rules,
) -> Decision:
    """The quorum to form now from the requests ``asked``, the last time each group was ``heard``,
    and the ``previous`` quorum's members (None: there was none)."""
    live = healthy(heard, now, rules.heartbeat_timeout)
    candidates = {rid: a for rid, a in asked.items() if rid in live}
    shrink_only = any(a.shrink_only for a in candidates.values())
    facts = (
        f"[{len(candidates)}/{len(asked)} participants healthy][{len(live)} heartbeating][shrink_only={shrink_only}]"
    )
    members = tuple(sorted(candidates))
    if previous:
        if shrink_only:
            members = tuple(rid for rid in members if rid in previous)
        if all(rid in candidates for rid in previous):
            return Decision(members, f"Fast quorum found! {facts}", fast=True)
    if len(candidates) < rules.min_replicas:
        return Decision(
            None,
            f"New quorum not ready, only have {len(candidates)} participants, "
            f"need min_replicas {rules.min_replicas} {facts}",
        )
    if len(candidates) <= len(live) // 2:
        return Decision(
            None,
            f"New quorum not ready, only have {len(candidates)} participants, "
            f"need at least half of {len(live)} healthy workers {facts}",
        )
    first = min((a.joined for a in candidates.values()), default=now)
    if len(candidates) < len(live) and now - first < rules.join_timeout:
        return Decision(
            None,
            f"Valid quorum with {len(candidates)} participants, waiting for {len(live) - len(candidates)} "
            f"healthy but not participating stragglers due to join timeout {facts}",
        )
    return Decision(members, f"Valid quorum found {facts}")


def next_id(previous_id: int, previous: Collection[str] | None, members: Collection[str], failures: bool) -> int:
    """The new quorum's id: one more than ``previous_id`` when there was no previous quorum, its
    members changed, or a member reported commit ``failures``; the same id otherwise."""
    if previous is None or sorted(previous) != sorted(members) or failures:
        return previous_id + 1
    return previous_id
