"""A job's account as one self-contained HTML page (``elastic-ctl report --html``): no script, no
server, no network -- inline CSS and SVG drawn here, opened by a person in any browser.

The page shows the goodput and the lost time by cause; a timeline, one row for the job (its time
cut by cause, rounds marked) and one row per node with a mark for every history record of that node
(hover: what it was); goodput per window; the costliest incidents first; what could not be told.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from rendezvous.job.history import Event, Kind

from .account import TITLES, Account, Segment, Spent
from .text import describe_seconds

__all__ = ["page", "COLORS", "MARKS"]

COLORS = {
    Spent.TRAINING: "#2f9e5c",
    Spent.WAITING: "#a3acb9",
    Spent.RENDEZVOUS: "#4f7fe0",
    Spent.START: "#f0a830",
    Spent.REDONE: "#e0533a",
    Spent.HANG: "#b3306f",
    Spent.STRAGGLER: "#a66ad8",
    Spent.FENCED: "#5c2d80",
    Spent.CHECKS: "#1a9fb4",
    Spent.STOPPING: "#6f7c88",
    Spent.UNKNOWN: "#333333",
}
MARKS = {  # a history record's kind: its mark's color (faults red, checks blue, rounds grey)
    Kind.WORKER_FAILED: "#d7301f",
    Kind.WORKER_HUNG: "#b3306f",
    Kind.NODE_LOST: "#7a0177",
    Kind.NODE_LEFT: "#e08214",
    Kind.JOB_CLOSED: "#111111",
    Kind.STRAGGLER: "#a66ad8",
    Kind.STRAGGLER_RECOVERED: "#5aae61",
    Kind.NODE_UNHEALTHY: "#1a9fb4",
    Kind.NODE_HEALTHY: "#5aae61",
    Kind.PREFLIGHT: "#1a9fb4",
    Kind.GROUP_RESTARTED: "#f0a830",
    Kind.ROUND_REQUESTED: "#4f7fe0",
}
_LEFT, _WIDTH, _ROW, _TOP = 190, 960, 24, 30
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2329;margin:24px 32px;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.big{font-size:34px;font-weight:650} .muted{color:#5d6872}
table{border-collapse:collapse} td,th{padding:3px 12px 3px 0;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;vertical-align:-1px}
svg text{font:11px system-ui,sans-serif;fill:#39424c}
.note{background:#fff7e0;border-left:3px solid #f0a830;padding:6px 10px;margin:6px 0}
"""


def page(account: Account, run_id: str, *, generated: float) -> str:
    when = datetime.fromtimestamp(generated, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = [
        f"<h1>Where the time of job {_e(run_id)} went</h1>",
        f'<div class="muted">{describe_seconds(account.wall)} from the first node\'s arrival, {account.rounds} '
        f"round(s), {'closed' if account.closed else 'running'}; made {when} by elastic-ctl report</div>",
        f'<p><span class="big" id="goodput">{account.goodput * 100:.1f} %</span> goodput: '
        f"{describe_seconds(account.productive)} of training in {describe_seconds(account.wall)}</p>",
        *[f'<div class="note">{_e(note)}</div>' for note in account.notes],
        "<h2>Where the time went</h2>",
        _causes(account),
        "<h2>Timeline</h2>",
        _timeline(account),
        "<h2>Goodput over time</h2>",
        _windows(account),
        "<h2>Costliest first</h2>",
        _incidents(account),
    ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>goodput of {_e(run_id)}</title>'
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _causes(account: Account) -> str:
    rows = [(Spent.TRAINING, account.productive), *account.lost.items()]
    out = ["<table><tr><th>where</th><th>seconds</th><th>share</th></tr>"]
    for cause, seconds in rows:
        share = seconds / account.wall * 100 if account.wall else 0.0
        out.append(
            f'<tr class="cause" data-cause="{cause.value}"><td><span class="sw" style="background:{COLORS[cause]}">'
            f'</span>{_e(TITLES[cause])}</td><td class="n">{seconds:.2f}</td><td class="n">{share:.1f} %</td></tr>'
        )
    return "\n".join(out) + "</table>"


def _nodes(events: tuple[Event, ...]) -> dict[str, float]:
    """Each node, from when it is first known: a round that names it joined, or its first record."""
    seen: dict[str, float] = {}
    for e in events:
        named = e.details.get("joined") if e.kind == Kind.ROUND_FROZEN else None
        for node in [e.node, *(named if isinstance(named, list) else [])]:
            seen[node] = min(seen.get(node, e.time), e.time)
    return dict(sorted(seen.items(), key=lambda item: item[1]))


def _timeline(account: Account) -> str:
    nodes = _nodes(account.events)
    height = _TOP + _ROW * (len(nodes) + 1) + 30
    x = _scale(account)
    out = [f'<svg id="timeline" width="{_LEFT + _WIDTH + 20}" height="{height}" role="img">']
    out.append(f'<text x="4" y="{_TOP + 15}">job (all nodes)</text>')
    for segment in account.segments:
        out.append(_segment(segment, x))
    for e in account.events:
        if e.kind == Kind.ROUND_FROZEN:
            at = x(e.time)
            out.append(
                f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{_TOP - 8}" y2="{height - 28}" stroke="#c5ccd3" '
                f'stroke-dasharray="2,3"/><text x="{at + 2:.1f}" y="{_TOP - 10}">r{e.round}</text>'
            )
    for row, (node, since) in enumerate(nodes.items(), 1):
        y = _TOP + row * _ROW + 11
        mine = [e for e in account.events if e.node == node]
        until = max([since, *(e.time for e in mine)])
        out.append(f'<text x="4" y="{y + 4}">{_e(node[:28])}</text>')
        out.append(
            f'<line x1="{x(since):.1f}" x2="{x(until):.1f}" y1="{y}" y2="{y}" '
            'stroke="#d5dbe1" stroke-width="6" stroke-linecap="round"/>'
        )
        out.extend(_mark(e, x(e.time), y) for e in mine)
    out.extend(_axis(account, x, height - 22))
    out.append("</svg>")
    return "\n".join(out)


def _scale(account: Account):
    wall = account.wall or 1.0
    return lambda t: _LEFT + (t - account.start) / wall * _WIDTH


def _segment(s: Segment, x) -> str:
    left, width = x(s.start), max(x(s.end) - x(s.start), 0.5)
    tip = f"round {s.round}: {TITLES[s.cause]}, {s.seconds:.2f} s"
    if s.drag:
        tip += f" ({s.drag:.2f} s of it lost to slow steps)"
    rect = (
        f'<rect class="segment" data-cause="{s.cause.value}" x="{left:.2f}" y="{_TOP}" width="{width:.2f}" '
        f'height="{_ROW - 6}" fill="{COLORS[s.cause]}"><title>{_e(tip)}</title></rect>'
    )
    if s.drag and s.seconds > 0:
        share = width * s.drag / s.seconds
        rect += (
            f'<rect x="{left:.2f}" y="{_TOP + _ROW - 12}" width="{share:.2f}" height="6" '
            f'fill="{COLORS[Spent.STRAGGLER]}"><title>{_e(tip)}</title></rect>'
        )
    return rect


def _mark(e: Event, cx: float, cy: float) -> str:
    color = MARKS.get(e.kind, "#8a96a3")
    details = ", ".join(f"{k}={v}" for k, v in sorted(e.details.items()) if k not in ("stack", "line"))
    when = datetime.fromtimestamp(e.time, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    tip = f"{when} round {e.round} {e.node}: {e.kind} {details}"
    radius = 5 if e.kind in MARKS else 3.5
    return (
        f'<g class="mark" data-kind="{_e(e.kind)}" data-round="{e.round}"><circle cx="{cx:.1f}" cy="{cy}" '
        f'r="{radius}" fill="{color}" stroke="#fff" stroke-width="1"/><title>{_e(tip[:400])}</title></g>'
    )


def _axis(account: Account, x, y: float) -> list[str]:
    step = _tick(account.wall)
    out = [f'<line x1="{_LEFT}" x2="{_LEFT + _WIDTH}" y1="{y}" y2="{y}" stroke="#8a96a3"/>']
    t = 0.0
    while t <= account.wall + 1e-9:
        px = x(account.start + t)
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y}" y2="{y + 4}" stroke="#8a96a3"/>')
        out.append(f'<text x="{px:.1f}" y="{y + 16}" text-anchor="middle">{_clock(t)}</text>')
        t += step
    return out


def _tick(wall: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if wall / step <= 12:
            return float(step)
    return 86400.0 * 7


def _clock(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:g} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d}"


def _windows(account: Account, count: int = 30) -> str:
    windows = account.windows(count)
    if not windows:
        return '<p class="muted">no time recorded</p>'
    height, bar = 120, _WIDTH / count
    out = [f'<svg id="windows" width="{_LEFT + _WIDTH + 20}" height="{height + 40}" role="img">']
    for level in (0.0, 0.5, 0.99):
        y = 10 + height * (1 - level)
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + _WIDTH}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d5dbe1"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{level * 100:g} %</text>')
    for i, (lo, hi, good) in enumerate(windows):
        h = max(height * min(good, 1.0), 0.5)
        tip = f"{_clock(lo - account.start)} to {_clock(hi - account.start)}: goodput {good * 100:.1f} %"
        out.append(
            f'<rect class="window" x="{_LEFT + i * bar + 1:.1f}" y="{10 + height - h:.1f}" width="{bar - 2:.1f}" '
            f'height="{h:.1f}" fill="{COLORS[Spent.TRAINING]}"><title>{tip}</title></rect>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _incidents(account: Account, top: int = 15) -> str:
    if not account.incidents:
        return '<p class="muted">nothing was lost</p>'
    out = ["<table><tr><th>cost</th><th>what</th><th>where it went</th></tr>"]
    for incident in account.incidents[:top]:
        parts = ", ".join(f"{TITLES[c]} {s:.2f} s" for c, s in incident.parts)
        out.append(
            f'<tr class="incident"><td class="n">{describe_seconds(incident.seconds)}</td>'
            f"<td>{_e(incident.what)}</td><td>{_e(parts)}</td></tr>"
        )
    return "\n".join(out) + "</table>"


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
