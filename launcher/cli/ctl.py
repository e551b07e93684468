"""``elastic-ctl``: look at a job and act on it from anywhere etcd can be reached.

Reads: ``status`` (the round and its nodes), ``watch`` (again on every change), ``history`` (the
job's timeline), ``report`` (where its time went: goodput), ``list`` (every job under the prefix).
Writes, each one line saying what it did: ``close`` (every agent stops its workers and exits 4),
``restart`` (a new round now, using no restart), ``reset`` (delete a finished job's keys so its id
can be used again), ``prune`` (delete finished jobs older than an age). A job that does not exist:
one line, exit 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

from launcher.errors import LauncherError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.watch import EventType, KeyRange, Watch
from rendezvous.job.history import Event, HistoryWriter, Kind, last_run, read_history
from rendezvous.job.keys import JobKeys
from rendezvous.rounds.operate import JobNotFound, JobRefused, close_job, request_round, reset_job
from rendezvous.rounds.snapshot import read_round
from rendezvous.rounds.view import JobView, get_state, stopped_of, view_of

from .ctl_etcd import ctl_etcd
from .ctl_jobs import CONF, ENDPOINT, connect, ctl_list, ctl_prune
from .ctl_report import ctl_report
from .ctl_torch import render_torch, torch_job
from .history_text import details_text, event_words

__all__ = ["elastic_ctl", "render", "render_history"]

_CTL_OPTIONS = [
    ENDPOINT,
    click.option("--rdzv-id", "--rdzv_id", envvar="PET_RDZV_ID", required=True, help="The job id."),
    CONF,
]
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _ctl_options(func: Callable) -> Callable:
    for option in reversed(_CTL_OPTIONS):
        func = option(func)
    return func


@click.group("elastic-ctl", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="etcd-elastic", prog_name="elastic-ctl", message="%(prog)s %(version)s")
def elastic_ctl() -> None:
    """Look at elastic jobs in etcd, and close, restart or reset one; run a local etcd."""


elastic_ctl.add_command(ctl_list)
elastic_ctl.add_command(ctl_prune)
elastic_ctl.add_command(ctl_etcd)
elastic_ctl.add_command(ctl_report)


def _ctl_client(endpoint: str, run_id: str, conf: str) -> tuple[EtcdClient, JobKeys]:
    client, prefix = connect(endpoint, conf, run_id)
    return client, JobKeys(prefix, run_id)


def _missing(run_id: str, endpoint: str, keys: JobKeys) -> LauncherError:
    return LauncherError(f"no job '{run_id}' at {endpoint} (under {keys.prefix})")


def render(view: JobView, heartbeats: bool = True) -> str:
    """The job as a table: a header line, then one row a node (with its workers' oldest heartbeat,
    which ``status`` asks the agents for, unless not ``heartbeats``)."""
    outcome = f"stopped ({view.stopped})" if view.stopped else view.outcome or view.status
    formed = f"world size {view.world_size}, master {view.master_addr or '-'}:{view.master_port or '-'}"
    if view.status == "joining":  # the state's world and master are still those of the round before
        before = f"round {view.round - 1} ran with {formed}" if view.round > 1 and view.world_size else "none ran yet"
        formed = f"round {view.round} forming ({before})"
    else:
        formed = f"round {view.round}, {formed}"
    lines = [
        f"job {view.run_id}: {outcome}, {formed} "
        f"(nodes min {view.min_nodes}, max {view.max_nodes}), "
        f"restarts {view.restarts}/{view.max_restarts}"
    ]
    if view.reason:
        lines.append(f"reason: {view.reason}")
    if view.stalled_restarts and view.outcome != "succeeded":  # nothing to warn of once the job succeeded
        lines.append(f"restarts in a row with no progress: {view.stalled_restarts} (crash-loop breaker)")
    lines += [f"unhealthy, out of the rounds: {node} ({why})" for node, why in view.unhealthy]
    lines += list(view.gray)
    rows = [("NODE", "GROUP RANK", "ADDRESS", "WORKERS", "ALIVE", "OLDEST HEARTBEAT")]
    for node in view.nodes:
        alive = ("finished" if node.finished else "yes") if node.alive else "no"
        beat = "-" if node.heartbeat_age is None else f"{node.heartbeat_age:.1f} s ago (rank {node.heartbeat_rank})"
        group_rank = "-" if node.group_rank is None else str(node.group_rank)
        rows.append((node.node, group_rank, node.addr, str(node.local_world_size), alive, beat))
    if not heartbeats:
        rows = [row[:-1] for row in rows]
    return "\n".join([*lines, *_table(rows)])


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _show(view: JobView, as_json: bool, heartbeats: bool = True) -> None:
    click.echo(json.dumps(view.as_dict(), sort_keys=True) if as_json else render(view, heartbeats))


@elastic_ctl.command("status")
@_ctl_options
@_JSON
def ctl_status(rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, as_json: bool) -> int:
    """Print the job's rendezvous state: status, round, restarts, and every node."""
    client, keys = _ctl_client(rdzv_endpoint, rdzv_id, rdzv_conf)
    with client:
        torch_state = torch_job(client, keys)
        if torch_state is not None:  # torchrun's handler's job: torch's state, read without unpickling
            click.echo(render_torch(torch_state, rdzv_id, as_json))
            return 0
        view = get_state(client, rdzv_id, key_prefix=keys.prefix, heartbeats=True)
    if view is None:
        raise _missing(rdzv_id, rdzv_endpoint, keys)
    _show(view, as_json)
    return 0


@elastic_ctl.command("watch")
@_ctl_options
@_JSON
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many seconds (default: until the job closes or Ctrl-C).",
)
def ctl_watch(rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, as_json: bool, timeout: float | None) -> int:
    """Print the job's state now and again each time it changes, until the job is closed."""
    client, keys = _ctl_client(rdzv_endpoint, rdzv_id, rdzv_conf)
    deadline = None if timeout is None else time.monotonic() + timeout
    with client:
        revision, view = _look(client, keys)
        shown = None
        with Watch(client, KeyRange(keys.root, prefix=True), start_revision=revision + 1) as watch:
            while True:
                if view != shown:
                    if view is None:
                        click.echo(f"no job '{rdzv_id}' yet; waiting")
                    else:
                        _show(view, as_json, heartbeats=False)
                        if not as_json:
                            click.echo("")
                    shown = view
                if view is not None and view.status == "closed":
                    return 0
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    return 0
                if watch.get(timeout=wait) is not None:
                    watch.drain()
                    _, view = _look(client, keys)


def _look(client: EtcdClient, keys: JobKeys) -> tuple[int, JobView | None]:
    """One read of the job for ``watch`` (and of its history when it is stopped), and the revision
    read at. No heartbeat ages: they are status's (it asks the agents), and change on every look."""
    snapshot = read_round(client, keys, all_nodes=True)
    return snapshot.revision, view_of(snapshot, stopped=stopped_of(client, keys, snapshot))


_BELOW = ("why", "stack")  # details shown under their event's row, as they were printed


def render_history(events: list[Event]) -> list[str]:
    """The timeline as table rows: time (UTC), round, node, event and details in words
    (``history_text``); a hang's line and stack go under its row, indented."""
    rows = [("TIME (UTC)", "ROUND", "NODE", "EVENT", "DETAILS")]
    for event in events:
        when = datetime.fromtimestamp(event.time, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        shown = {k: v for k, v in event.details.items() if k not in _BELOW}
        rows.append((when, str(event.round), event.node, event_words(event.kind), details_text(event.kind, shown)))
    lines = _table(rows)
    out = lines[:1]
    for event, line in zip(events, lines[1:]):
        out.append(line)
        for key in _BELOW:
            text = event.details.get(key)
            if isinstance(text, str) and text:
                out.extend("    " + part for part in text.splitlines())
    return out


@elastic_ctl.command("history")
@_ctl_options
@_JSON
@click.option("--all", "show_all", is_flag=True, help="Also each round's round_ended records (what report reads).")
@click.option("--follow", is_flag=True, help="Then print new events as they come, until the job closes.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop following after this many seconds.",
)
def ctl_history(
    rdzv_endpoint: str,
    rdzv_id: str,
    rdzv_conf: str,
    as_json: bool,
    show_all: bool,
    follow: bool,
    timeout: float | None,
) -> int:
    """Print the job's timeline: rounds, nodes joining and leaving, failures, restarts, the close."""
    client, keys = _ctl_client(rdzv_endpoint, rdzv_id, rdzv_conf)
    with client:
        events, revision = read_history(client, keys.root)
        if not events and client.get(keys.state) is None:
            raise _missing(rdzv_id, rdzv_endpoint, keys)
        shown = (lambda event: True) if show_all else (lambda event: event.kind not in _ACCOUNTING)
        events = [e for e in events if shown(e)]
        if as_json and not follow:
            click.echo(json.dumps([e.as_dict() for e in events], sort_keys=True))
            return 0
        _print_events(events, as_json, header=True)
        if not follow or any(e.kind == Kind.JOB_CLOSED for e in last_run(events)):  # its newest run closed
            return 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with Watch(client, KeyRange(keys.history, prefix=True), start_revision=revision + 1) as watch:
            while deadline is None or time.monotonic() < deadline:
                change = watch.get(timeout=1.0 if deadline is None else min(1.0, deadline - time.monotonic()))
                if change is None or change.type is not EventType.PUT:
                    continue
                try:
                    event = Event.decode(change.value)
                except Exception:  # noqa: BLE001 -- not a record of ours: skip it
                    continue
                if shown(event):
                    _print_events([event], as_json, header=False)
                if event.kind == Kind.JOB_CLOSED:
                    return 0
    return 0


_ACCOUNTING = (Kind.ROUND_ENDED,)  # records for the goodput account (elastic-ctl report), shown with --all


def _print_events(events: list[Event], as_json: bool, header: bool) -> None:
    if as_json:  # --follow --json: one JSON object a line
        for event in events:
            click.echo(json.dumps(event.as_dict(), sort_keys=True))
        return
    rows = render_history(events)
    for line in rows if header else rows[1:]:
        click.echo(line)


def _write(endpoint: str, run_id: str, conf: str, action: Callable[[EtcdClient, JobKeys, HistoryWriter], Any]) -> Any:
    """Run an operator's write with a history writer of its own; a missing or refusing job is one line, exit 1."""
    import getpass
    import socket

    client, keys = _ctl_client(endpoint, run_id, conf)
    with client:
        history = HistoryWriter(client, keys.root, f"elastic-ctl@{getpass.getuser()}@{socket.gethostname()}")
        try:
            return action(client, keys, history)
        except JobNotFound:
            raise _missing(run_id, endpoint, keys) from None
        except JobRefused as exc:
            raise LauncherError(str(exc)) from None
        finally:
            history.close()


@elastic_ctl.command("close")
@_ctl_options
@click.option("--reason", required=True, help="Why: shown by status and history, and by every agent.")
def ctl_close(rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, reason: str) -> int:
    """Close the job: every agent stops its workers (SIGTERM, SIGKILL after its --shutdown-timeout) and exits 4."""
    before, after = _write(rdzv_endpoint, rdzv_id, rdzv_conf, lambda c, k, h: close_job(c, k, reason, h))
    if after is before:
        click.echo(f"job {rdzv_id} was already closed ({before.reason})")
    else:
        click.echo(f"closed job {rdzv_id} at round {after.round}: {reason}")
    return 0


@elastic_ctl.command("restart")
@_ctl_options
@click.option("--reason", default="an operator asked for a new round", show_default=True, help="Why.")
def ctl_restart(rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, reason: str) -> int:
    """Start a new round now (e.g. to take in waiting nodes), without using a --max-restarts restart."""
    before, after = _write(rdzv_endpoint, rdzv_id, rdzv_conf, lambda c, k, h: request_round(c, k, reason, h))
    if after is before:
        click.echo(f"job {rdzv_id} is already forming round {before.round}")
    else:
        click.echo(
            f"job {rdzv_id}: round {after.round} is forming ({reason}); the restart count stays {after.restarts}"
        )
    return 0


@elastic_ctl.command("reset")
@_ctl_options
@click.option("--force", is_flag=True, help="Even while nodes are alive (they then start the job afresh).")
def ctl_reset(rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, force: bool) -> int:
    """Delete a finished or closed job's keys, so its id can be used again."""
    deleted, root = _write(rdzv_endpoint, rdzv_id, rdzv_conf, lambda c, k, h: (reset_job(c, k, force=force), k.root))
    click.echo(f"reset job {rdzv_id}: deleted its {deleted} keys under {root}")
    return 0
