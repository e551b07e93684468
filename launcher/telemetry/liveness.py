"""What the agent's probes answer, pure: liveness and readiness from a snapshot of the agent.

- liveness (``/healthz``): the agent's loop is turning (it looked at its workers within ``STALL``
  seconds while they run) and, once it holds a lease, the lease was renewed within the renew deadline;
- readiness (``/readyz``): its workers run in a frozen round.
The HTTP side is ``launcher/telemetry/httpserver.py``, imported only when the endpoint is on.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AgentSnapshot", "liveness", "readiness", "STALL"]

STALL = 30.0  # seconds without a turn of the agent's loop after which it is not live


@dataclass(frozen=True)
class AgentSnapshot:
    """What the probes judge, read from the agent at the time of the request."""

    state: str
    since_turn: float  # seconds since the agent's loop last turned
    round: int | None
    world_size: int | None
    group_rank: int | None
    has_lease: bool
    lease_age: float  # seconds since the last acknowledged renewal was sent
    renew_deadline: float
    workers_running: int


def liveness(s: AgentSnapshot) -> tuple[bool, str]:
    if s.since_turn > STALL:
        return False, f"not live: the agent's loop has not turned for {s.since_turn:.1f} s (state {s.state})"
    if s.has_lease and s.lease_age > s.renew_deadline:
        return False, (
            f"not live: no lease renewal for {s.lease_age:.1f} s (renew deadline {s.renew_deadline:g} s); "
            "the workers are fenced"
        )
    lease = f", lease renewed {s.lease_age:.1f} s ago" if s.has_lease else ""
    return True, f"ok: {s.state}{lease}"


def readiness(s: AgentSnapshot) -> tuple[bool, str]:
    if s.state == "running" and s.round is not None and s.workers_running > 0:
        return True, (
            f"ready: {s.workers_running} workers running in round {s.round} "
            f"(world size {s.world_size}, group rank {s.group_rank})"
        )
    where = f" (round {s.round})" if s.round is not None else ""
    return False, f"not ready: {s.state}{where}, {s.workers_running} workers running"
