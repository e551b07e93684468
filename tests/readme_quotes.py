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


def history_shape(lines: list[str]) -> list[tuple[str, str, str]]:
    """Each row of an ``elastic-ctl history`` table as (round, event, the words of its details):
    what a real run of the same job has too. Columns are apart by two spaces or more; in the
    details, every word with a digit in it (times, counts, node names, ranks) reads ``#`` and a
    host's name after ``on`` reads ``HOST``, as they differ from run to run and machine to machine."""
    rows = []
    for line in lines[1:]:
        if line.startswith(" "):
            continue  # a hang's line or stack, under its row
        fields = re.split(r" {2,}", line.strip(), maxsplit=4)  # time, round, node, event, details
        details = fields[4] if len(fields) > 4 else ""
        details = re.sub(r"\bon [^\s:]+:", "on HOST:", re.sub(r"[^\s,;:]*\d[^\s,;:]*", "#", details))
        rows.append((fields[1], fields[3], details))
    return rows
