"""The documentation a newcomer reads: a README of at most about 250 lines whose links into docs/
all land (the file and the heading), and docs/ that builds as a site with ``mkdocs build --strict``
(every page in the nav, every link and anchor between pages resolved)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())  # headings in code blocks are not headings
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def test_the_readme_is_short_and_starts_with_the_two_commands():
    assert len(README.splitlines()) <= 250
    assert README.index("```bash") < README.index("\n## ")


def test_every_link_of_the_readme_lands_on_a_page_and_a_heading_that_exist():
    links = re.findall(r"\]\(([^)#]+\.md)(?:#([^)]+))?\)", README)
    assert len(links) >= 15, links
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        if anchor:
            assert anchor in _anchors(page), f"{path} has no heading #{anchor}"
    linked = {Path(path).name for path, _ in links}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "faults.html").is_file()
