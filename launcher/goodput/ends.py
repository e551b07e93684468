"""What ended a round, in the words of the goodput report's list of incidents: the first record of
the round that explains it (a failed or hung rank, a node lost or gone, a straggler, an operator)."""

from __future__ import annotations

from collections.abc import Sequence

from rendezvous.job.history import Event, Kind

__all__ = ["describe_end"]


def describe_end(number: int, outcome: str, events: Sequence[Event]) -> str:
    """What ended round ``number``, from its records: a failed or hung rank, a node lost or gone, a
    straggler (``outcome``: its ``round_ended`` record's, "" when none was written)."""
    kinds = (
        Kind.WORKER_HUNG,
        Kind.WORKER_FAILED,
        Kind.NODE_LOST,
        Kind.NODE_LEFT,
        Kind.STRAGGLER,
        Kind.ROUND_REQUESTED,
        Kind.JOB_CLOSED,
    )
    for kind in kinds:
        found = [e for e in events if e.kind == kind]
        if found:
            return f"round {number}: " + _what(found[0])
    outcome = outcome or "its nodes' records are missing"
    if outcome == "succeeded":
        return f"round {number}: the job's end"
    return f"round {number}: {outcome}"


def _what(e: Event) -> str:
    d = e.details
    if e.kind == Kind.WORKER_FAILED:
        how = f"signal {d['signal']}" if d.get("signal") else f"exit code {d.get('exit_code')}"
        return f"rank {d.get('rank')} on {e.node} failed ({how})"
    if e.kind == Kind.WORKER_HUNG:
        return f"rank {d.get('rank')} on {e.node} hung"
    if e.kind == Kind.NODE_LOST:
        return f"node {d.get('node', e.node)} lost ({d.get('reason', '')})"
    if e.kind == Kind.NODE_LEFT:
        return f"node {e.node} left ({d.get('reason', '')})"
    if e.kind == Kind.STRAGGLER:
        return f"rank {d.get('rank')} on {e.node} straggled (score {d.get('score')})"
    if e.kind == Kind.JOB_CLOSED:
        return f"the job's end ({d.get('reason', '')})"
    return f"an operator asked for a new round ({d.get('reason', '')})"
