"""The README's metric table is what a real agent serves: every metric it lists is scraped with the
labels it says, and every metric scraped is listed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.hangs.helpers import Agent
from tests.readme_quotes import DOCS

from .helpers import endpoint_of, get, until

ROOT = Path(__file__).resolve().parents[2]
COMMON = {"run_id", "node"}  # every metric's labels


def _documented() -> dict[str, set[str]]:
    """metric -> its labels beyond run_id and node, from the README's table ('process_*' kept as is)."""
    text = DOCS
    table = text[text.index("  | metric | what |") :]
    table = table[: table.index("\n\n")]
    found = {}
    for row in table.splitlines()[2:]:
        for name, labels in re.findall(r"`([a-z_*]+)(?:\{([a-z_,]+)\})?`", row.split("|")[1]):
            found[name] = set(labels.split(",")) if labels else set()
    return found


def _scraped(body: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(family -> type, sample name -> its label names) of a Prometheus text exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
    samples: dict[str, set[str]] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            name = name.split()[0]
            labels = set(re.findall(r'([a-zA-Z_]+)="', rest)) if rest else set()
            samples.setdefault(name, set()).update(labels)
    return types, samples


def test_the_readme_metric_table_is_what_an_agent_serves(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import time\ntime.sleep(5)\n")
    agent = Agent(["--standalone", "--http-port", "0", "--http-host", "127.0.0.1", str(script)])
    try:
        url = f"http://{endpoint_of(agent.lines)}"
        until(url + "/readyz", 200, "ready", 30)
        status, body = get(url + "/metrics")
    finally:
        agent.kill()
    assert status == 200
    types, samples = _scraped(body)
    documented = _documented()
    served = {}
    for family, kind in types.items():
        name = f"{family}_total" if kind == "counter" and not family.endswith("_total") else family
        sample = f"{family}_bucket" if kind == "histogram" else name
        served[name] = samples[sample] - COMMON - {"le"} if sample in samples else None  # None: no sample yet
    assert not [name for name in samples if name.endswith("_created")], "a *_created series is served"
    process = {name for name in served if name.startswith("process_")}
    assert process and "process_*" in documented
    assert set(documented) - {"process_*"} == set(served) - process, (set(documented) ^ set(served)) - process
    for name, labels in documented.items():
        if name != "process_*" and served[name] is not None:  # a labelled counter has no sample until counted
            assert served[name] == labels, f"{name}: the README says {{{','.join(labels)}}}, served {served[name]}"
    assert sum(labels is not None for labels in served.values()) >= 12, served
    assert re.search(r'^elastic_agent_state\{node="[^"]+",run_id="[^"]+",state="running"\} 1\.0$', body, re.M)
