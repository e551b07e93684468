"""``elastic-ctl status`` on a job that torchrun's own handler runs (``torchrun --rdzv-backend
etcd-v3``): its state is torch's pickle, which nothing here unpickles -- what plain data it holds
is read from its opcodes (``rendezvous.torchrun.torchstate``) and shown."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from rendezvous.errors import RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.keys import JobKeys, unwrap_state
from rendezvous.torchrun.torchstate import TorchState, is_torch_state, read_torch_state

__all__ = ["torch_job", "render_torch"]


def torch_job(client: EtcdClient, keys: JobKeys) -> TorchState | None:
    """The job's state when torchrun's handler wrote it (None: no state, or this project's own)."""
    kv = client.get(keys.state)
    if kv is None:
        return None
    try:
        state = unwrap_state(keys.state, kv.value)
    except RendezvousStateError:
        return None  # not ours at all: the usual path names it
    return read_torch_state(state) if is_torch_state(state) else None


def render_torch(state: TorchState, run_id: str, as_json: bool, now: datetime | None = None) -> str:
    """The job as torch's handler keeps it: its round, whether it is complete or closed, its nodes."""
    now = now or datetime.now(timezone.utc)
    age = (now - state.last_heartbeat).total_seconds() if state.last_heartbeat else None
    if as_json:
        nodes = [{"addr": n.addr, "pid": n.pid, "local_id": n.local_id, "rank": n.rank} for n in state.participants]
        view = {"run_id": run_id, "handler": "torchrun", "round": state.round, "complete": state.complete,
                "closed": state.closed, "participants": nodes, "waiting": state.waiting,
                "redundant": state.redundant, "last_heartbeat_age": age}  # fmt: skip
        return json.dumps(view, sort_keys=True)
    status = "closed" if state.closed else "running" if state.complete else "forming"
    lines = [
        f"job {run_id}: {status}, round {state.round}, {len(state.participants)} participants, "
        f"{state.waiting} waiting, {state.redundant} redundant (started by torchrun's etcd-v3 handler: torch's "
        "own state, read without unpickling; elastic-ctl history and report cover elastic-run's jobs)",
    ]
    if age is not None:
        lines.append(f"newest node heartbeat: {age:.1f} s ago")
    rows = [("RANK", "ADDRESS", "PID", "LOCAL ID")]
    rows += [(str(n.rank), n.addr, str(n.pid), str(n.local_id)) for n in state.participants]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)
