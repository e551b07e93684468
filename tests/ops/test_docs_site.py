"""The documentation site as a reader sees it: built with mkdocs, each page opened in a headless
chromium 1280 px wide. No table runs past the text column, no page shows a literal ``\\|`` (a pipe
escaped for GitHub inside a code span, which the site keeps), and no page repeats its title as its
first section's heading."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

MEASURE = """<script>window.addEventListener('load', () => {
  const column = document.querySelector('[role=main]') || document.body;
  const edge = column.getBoundingClientRect().right;
  const tables = [...column.querySelectorAll('table')].map(t => Math.round(t.getBoundingClientRect().right - edge));
  const h1 = (column.querySelector('h1') || {}).innerText || '';
  const h2 = (column.querySelector('h2') || {}).innerText || '';
  const seen = {past: tables.filter(x => x > 1), piped: column.innerText.includes('\\\\|'), h1: h1, h2: h2};
  const out = document.createElement('pre'); out.id = 'seen'; out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
});</script>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(out)], cwd=ROOT, capture_output=True, timeout=120
    )
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    return out


def _seen(page: str) -> dict:
    with open(page) as file:
        html = file.read()
    probe = page[: -len(".html")] + ".seen.html"
    with open(probe, "w") as file:
        file.write(html.replace("</body>", MEASURE + "</body>"))
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900", "--virtual-time-budget=3000"]
    dom = subprocess.run([CHROMIUM, *args, "--dump-dom", "file://" + probe], capture_output=True, text=True, timeout=60)
    text = dom.stdout.split('<pre id="seen">', 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (Debian: apt-get install chromium; .ci/run does)")
def test_every_page_fits_1280_px_shows_no_escaped_pipe_and_says_its_title_once(site):
    pages = sorted(name for name in os.listdir(site) if name.endswith(".html") and name != "404.html")
    assert "getting-started.html" in pages and len(pages) >= 20, pages
    problems = []
    for name in pages:
        seen = _seen(os.path.join(site, name))
        if seen["past"]:
            problems.append(f"{name}: a table runs {max(seen['past'])} px past the text column")
        if seen["piped"]:
            problems.append(f"{name}: a literal \\| on the page")
        if seen["h1"] and seen["h1"].strip() == seen["h2"].strip():
            problems.append(f"{name}: its title again as its first heading ({seen['h1']!r})")
    assert not problems, problems
