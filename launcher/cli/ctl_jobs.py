"""``elastic-ctl list`` and ``elastic-ctl prune``: every job under a key prefix, and the removal of
finished ones. A finished job's keys expire by themselves after its retention (``--rdzv-conf
retention=``, 3 days by default); ``prune`` is for sooner, or for jobs kept forever (retention 0)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import click

from rendezvous.etcd.client import EtcdClient
from rendezvous.job.catalog import JobEntry, list_jobs
from rendezvous.rounds.operate import prune_jobs
from rendezvous.settings import RendezvousSettings

__all__ = ["ctl_list", "ctl_prune", "parse_age", "describe_age", "connect", "ENDPOINT", "CONF"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d`` or ``2w`` in seconds; ValueError naming the text otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not found:
        raise ValueError(f"{text!r} is not an age: a number of seconds, or one with s, m, h, d or w (7d)")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def describe_age(seconds: float | None) -> str:
    """``2d 3h``, ``45m``, ``12s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(max(seconds, 0))
    days, hours, minutes = seconds // 86400, seconds % 86400 // 3600, seconds % 3600 // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{seconds}s"


class _Age(click.ParamType):
    name = "age"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return parse_age(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


ENDPOINT = click.option(
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    envvar="PET_RDZV_ENDPOINT",
    required=True,
    help="etcd endpoints, host:port[,...].",
)
CONF = click.option(
    "--rdzv-conf",
    "--rdzv_conf",
    envvar="PET_RDZV_CONF",
    default="",
    help="key_prefix, read_timeout, TLS and user settings, key=value,...",
)


def connect(endpoint: str, conf: str, run_id: str = "elastic-ctl") -> tuple[EtcdClient, str]:
    """elastic-ctl's client, and the key prefix, from --rdzv-endpoint and --rdzv-conf (warnings on stderr)."""
    settings = RendezvousSettings.from_conf(
        run_id, 1, 1, conf, warn=lambda line: click.echo(f"elastic-ctl: {line}", err=True)
    )
    return EtcdClient(settings.target(endpoint)), settings.key_prefix


def _row(job: JobEntry, now: float) -> dict[str, Any]:
    state = job.state
    closed = state.keep.closed_at if state is not None else None
    return {
        "run_id": job.run_id,
        "status": state.status.value if state is not None else "unknown",
        "outcome": state.outcome(job.nodes).value if state is not None else "unknown",
        "round": state.round if state is not None else None,
        "closed_ago": round(now - closed, 1) if closed is not None else None,
        "nodes": job.nodes,
        "restarts": state.restarts if state is not None else None,
        "max_restarts": state.max_restarts if state is not None else None,
        "keys": job.keys,
        "bytes": job.bytes,
        "expires_in": job.expires_in,
        "reason": state.reason if state is not None else "",
        "stopped_since": job.stopped.since if job.stopped is not None else None,
        "stopped": job.stopped.describe(now) if job.stopped is not None else "",
    }


@click.command("list")
@ENDPOINT
@CONF
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ctl_list(rdzv_endpoint: str, rdzv_conf: str, as_json: bool) -> int:
    """List the jobs under the key prefix: state, age, live nodes, restarts, what each keeps in etcd."""
    client, prefix = connect(rdzv_endpoint, rdzv_conf)
    with client:
        jobs = list_jobs(client, prefix)
    now = time.time()
    rows = [_row(job, now) for job in jobs]
    if as_json:
        click.echo(json.dumps(rows, sort_keys=True))
        return 0
    table = [("JOB", "STATUS", "ROUND", "CLOSED", "NODES", "RESTARTS", "KEYS", "BYTES", "EXPIRES IN", "REASON")]
    for job, r in zip(jobs, rows):
        status = job.stopped.short(now) if job.stopped is not None else r["outcome"]
        restarts = f"{r['restarts']}/{r['max_restarts']}" if r["restarts"] is not None else "-"
        closed = describe_age(r["closed_ago"]) + " ago" if r["closed_ago"] is not None else "-"
        expires = describe_age(r["expires_in"]) if r["expires_in"] is not None else "never"
        table.append(
            (r["run_id"], status, str(r["round"] or "-"), closed, str(r["nodes"]), restarts, str(r["keys"]),
             str(r["bytes"]), expires, _clip(r["reason"]))
        )  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    click.echo(f"{len(rows)} job{'s' if len(rows) != 1 else ''} under {prefix or '/'}")
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _clip(text: str, width: int = 100) -> str:
    """One line of at most ``width`` characters (the whole reason is in --json and status)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


@click.command("prune")
@ENDPOINT
@CONF
@click.option("--older-than", type=_Age(), required=True, help="Closed at least this long ago: 3600, 12h, 7d.")
def ctl_prune(rdzv_endpoint: str, rdzv_conf: str, older_than: float) -> int:
    """Delete every finished job closed at least --older-than ago (running jobs are never touched)."""
    client, prefix = connect(rdzv_endpoint, rdzv_conf)
    with client:
        pruned = prune_jobs(client, prefix, older_than, time.time())
    if pruned:
        click.echo(f"pruned {len(pruned)} finished job{'s' if len(pruned) > 1 else ''}: {', '.join(pruned)}")
    else:
        click.echo(f"no finished job closed more than {describe_age(older_than)} ago")
    return 0
