"""``elastic-ctl report RDZV_ID``: where every second of a job went -- its goodput, the time lost
by cause and the costliest incidents, printed as a table, and a page a person opens in a browser
(``--html``, written by default beside where it runs)."""

from __future__ import annotations

import json
import os
import time

import click

from launcher.errors import LauncherError
from launcher.goodput.account import TITLES, Account, account_of
from launcher.goodput.page import page
from launcher.goodput.text import report_lines
from rendezvous.job.history import read_history
from rendezvous.job.keys import JobKeys

from .ctl_jobs import CONF, ENDPOINT, connect

__all__ = ["ctl_report", "account_json"]


@click.command("report")
@click.argument("rdzv_id_arg", metavar="RDZV_ID", required=False)
@ENDPOINT
@click.option("--rdzv-id", "--rdzv_id", envvar="PET_RDZV_ID", default=None, help="The job id (or as the argument).")
@CONF
@click.option("--html", "html_path", default=None, help="Where the page goes (default: goodput-RDZV_ID.html here).")
@click.option("--no-html", is_flag=True, help="Print the table only.")
@click.option("--json", "as_json", is_flag=True, help="Print the account as JSON instead of a table.")
def ctl_report(
    rdzv_id_arg: str | None,
    rdzv_endpoint: str,
    rdzv_id: str | None,
    rdzv_conf: str,
    html_path: str | None,
    no_html: bool,
    as_json: bool,
) -> int:
    """Print where the job's time went (goodput, lost time by cause, costliest first) and write it
    as a page with a timeline."""
    run_id = rdzv_id_arg or rdzv_id
    if not run_id:
        raise click.UsageError("name the job: elastic-ctl report RDZV_ID (or --rdzv-id)")
    client, prefix = connect(rdzv_endpoint, rdzv_conf, run_id)
    keys = JobKeys(prefix, run_id)
    with client:
        events, _ = read_history(client, keys.root)
        if not events and client.get(keys.state) is None:
            raise LauncherError(f"no job '{run_id}' at {rdzv_endpoint} (under {keys.prefix})")
    now = time.time()
    account = account_of(events, now=now)
    click.echo(
        json.dumps(account_json(account), sort_keys=True) if as_json else "\n".join(report_lines(account, run_id))
    )
    if not no_html:
        path = html_path or f"goodput-{run_id}.html"
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(page(account, run_id, generated=now))
        except OSError as exc:
            raise LauncherError(f"--html {path!r} cannot be written: {exc.strerror}") from None
        click.echo(f"the page: {os.path.abspath(path)}", err=as_json)
    return 0


def account_json(account: Account) -> dict:
    """The account as ``--json`` prints it."""
    return {
        "start": account.start,
        "end": account.end,
        "wall": round(account.wall, 3),
        "closed": account.closed,
        "rounds": account.rounds,
        "goodput": round(account.goodput, 5),
        "productive": round(account.productive, 3),
        "lost": {cause.value: round(seconds, 3) for cause, seconds in account.lost.items()},
        "incidents": [
            {
                "round": i.round,
                "what": i.what,
                "seconds": i.seconds,
                "parts": {c.value: round(s, 3) for c, s in i.parts},
            }
            for i in account.incidents
        ],
        "segments": [
            {"start": s.start, "end": s.end, "cause": s.cause.value, "round": s.round, "drag": s.drag}
            for s in account.segments
        ],
        "notes": list(account.notes),
        "titles": {cause.value: title for cause, title in TITLES.items()},
    }
