"""What the documentation quotes (README.md and docs/*.md, as one text: ``DOCS``): the fenced block
that shows a command's output, for the tests that run the same command for real and compare (so a
quoted output cannot drift from what the tools print)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
README = DOCS  # the tests that read a table or a quote find it on whichever page holds it


def quoted_output(command: str) -> list[str]:
    """The lines the README shows after ``$ <command>...`` in a fenced block, up to the fence."""
    found = re.search(r"^\$ " + re.escape(command) + r"[^\n]*\n(.*?)^```", README, re.M | re.S)
    assert found, f"the README no longer quotes the output of {command!r}"
    return found.group(1).rstrip("\n").splitlines()


def history_shape(lines: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """Each row of an ``elastic-ctl history`` table as (round, event, its detail keys): what a real
    run of the same job has too (times, node names and durations differ from run to run)."""
    rows = []
    for line in lines[1:]:
        if line.startswith(" "):
            continue  # a hang's line or stack, under its row
        fields = line.split(None, 5)  # date, time, round, node, event, details
        details = fields[5] if len(fields) > 5 else ""
        keys = tuple(sorted(re.findall(r"(?:^|\s)(\w+)=", details)))
        rows.append((fields[2], fields[4], keys))
    return rows
