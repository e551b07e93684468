"""The README's fresh-machine commands are the ones CI runs."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _first_code_block(text: str) -> list[str]:
    start = text.index("```bash\n") + len("```bash\n")
    return text[start : text.index("```", start)].strip().splitlines()


def test_ci_runs_the_readme_test_command_verbatim():
    readme_commands = _first_code_block((ROOT / "README.md").read_text())
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_command = readme_commands[-1]
    assert "pytest" in test_command
    assert test_command in ci_lines


def test_readme_starts_with_the_fresh_machine_commands():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("\n## ")


def test_readme_first_command_runs_the_example_job():
    first = _first_code_block((ROOT / "README.md").read_text())[0]
    assert "pip install -e '.[test]'" in first
    assert first.endswith("elastic-run --standalone --nproc-per-node 2 examples/hello.py")
    assert (ROOT / "examples" / "hello.py").is_file()


def test_the_readme_exit_code_table_is_the_codes_table():
    from launcher.errors import EXIT_CODES, EXIT_INFRA, describe_code

    text = DOCS
    section = text[text.index("## Exit codes") :]
    section = section[: section.index("\n#", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    stated = [tuple(cell.strip().strip("`") for cell in row.strip("|").split("|")) for row in rows]
    assert stated == [(r.code, r.meaning, "yes" if r.retry else "no") for r in EXIT_CODES]
    assert all(describe_code(c).retry == (c >= 128) for c in (0, 1, 2, 3, 4, 5, 130, 143, EXIT_INFRA))


def _settings_rows() -> dict[str, str]:
    """The README's Settings table: each key (of a row naming several, each) -> its meaning."""
    text = DOCS
    section = text[text.index("Settings (`--rdzv-conf key=value,...`") :]
    section = section[: section.index("\n\n", section.index("| key |"))]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            keys, _, meaning = (cell.strip() for cell in line.strip("|").split("|"))
            for key in re.findall(r"`([a-z_]+)`", keys):
                rows[key] = meaning
    return rows


def test_the_settings_table_names_every_key_and_its_exit_codes_are_the_codes_tables():
    from launcher.errors import EXIT_CODES
    from rendezvous.settings import CONF_KEYS

    rows = _settings_rows()
    assert set(rows) == set(CONF_KEYS), set(rows) ^ set(CONF_KEYS)
    meaning = {row.code: row.meaning for row in EXIT_CODES}
    stated = {key: int(found.group(1)) for key, text in rows.items() if (found := re.search(r"exits (\d+)", text))}
    assert stated == {"join_timeout": 200, "connect_timeout": 200, "user": 2, "password": 2}
    for key, code in stated.items():
        words = "credentials" if key in ("user", "password") else key
        assert words in meaning[str(code)], (
            f"{key} exits {code}, but the codes table's {code} says: {meaning[str(code)]}"
        )


def _code_map() -> dict[str, str]:
    """The README's code map as {folder: its text}: a package's whole section under its top folder
    (``launcher``), and each sub-folder's own words (``launcher/cli``)."""
    block = DOCS.split("# Code map", 1)[1].split("```", 2)[1]
    sections: dict[str, str] = {}
    top = sub = ""
    for token in re.split(r"(?m)(^\w+/|(?<=\s)\w+/(?=\s))", block):
        if re.fullmatch(r"\w+/", token or ""):
            name = token[:-1]
            if name in ("elastic", "launcher", "rendezvous"):
                top, sub = name, name
            else:
                sub = f"{top}/{name}"
            continue
        sections[top] = sections.get(top, "") + (token or "")
        sections[sub] = sections.get(sub, "") + (token or "")
    return sections


def test_the_code_map_names_every_module_where_it_lives():
    sections = _code_map()
    missing = []
    for path in sorted(p for package in ("elastic", "launcher", "rendezvous") for p in (ROOT / package).rglob("*.py")):
        if path.name == "__init__.py":
            continue
        folder = path.parent.relative_to(ROOT).as_posix()
        words = sections.get(folder, "")
        if not re.search(rf"(?<![\w/]){re.escape(path.stem)}(?![\w/])", words):
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"the README's code map does not name: {missing}"


def test_the_readme_options_table_is_the_option_tables():
    from launcher.cli.helpfmt import markdown

    made = "python -c 'from launcher.cli.helpfmt import markdown; print(markdown())'"
    assert markdown() in DOCS, f"the options table in docs/ is not launcher/options/table.py's ({made})"


def test_each_sub_package_s_docstring_names_its_modules():
    """A package's docstring is its map: every module of launcher/*/, rendezvous/*/ and lighthouse/
    is named in it (the top packages' maps are the code map above)."""
    stale = {}
    packages = [
        *ROOT.glob("launcher/*/__init__.py"),
        *ROOT.glob("rendezvous/*/__init__.py"),
        ROOT / "lighthouse/__init__.py",
    ]
    for init in packages:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        modules = [p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        missing = [m for m in modules if not re.search(rf"(?<![\w]){re.escape(m)}(?![\w])", doc)]
        if missing:
            stale[init.parent.relative_to(ROOT).as_posix()] = missing
    assert not stale, stale
