"""The packages' imports: no cycle between modules or packages, the direction elastic, lighthouse ->
launcher -> rendezvous,
and inside rendezvous the layers rounds -> job -> etcd: the etcd client knows no job, a job's data
knows nothing of how rounds are decided, and only the torchrun plugin and store know torchrun."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("elastic", "launcher", "lighthouse", "rendezvous")
# What each layer of rendezvous may import of the package, besides itself: (layer, allowed prefixes).
LAYERS = (
    ("rendezvous.etcd", ("rendezvous.errors", "rendezvous.processes")),
    ("rendezvous.job", ("rendezvous.errors", "rendezvous.etcd")),
    ("rendezvous.rounds", ("rendezvous.errors", "rendezvous.etcd", "rendezvous.job", "rendezvous.settings")),
    ("rendezvous.settings", ("rendezvous.errors", "rendezvous.etcd", "rendezvous.job")),
    ("rendezvous.processes", ()),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the project modules it imports (module level and inside functions alike)."""
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_module_imports_itself_through_others():
    # package __init__ modules re-export their submodules: an edge into a package's own __init__ is not a cycle
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in _imports().items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def _folder(module: str, modules: set[str]) -> str:
    """The package (folder) a module is in; a package's __init__ is its own folder."""
    return module if any(m.startswith(module + ".") for m in modules) else module.rpartition(".")[0]


def test_no_folder_imports_itself_through_others():
    """The same at the level of folders: workers -> hangs -> workers is a loop even where no module
    imports itself (a module imports its parent's __init__ freely)."""
    graph_of_modules = _imports()
    folders: dict[str, set[str]] = {}
    for module, targets in graph_of_modules.items():
        here = _folder(module, set(graph_of_modules))
        there = {_folder(t, set(graph_of_modules)) for t in targets}
        folders.setdefault(here, set()).update(f for f in there if not (here + ".").startswith(f + ".") and f != here)
    for folder in list(folders):
        for f in list(folders[folder]):
            folders.setdefault(f, set())
    assert _cycle(folders) is None, " -> ".join(_cycle(folders))


def test_imports_point_from_elastic_to_launcher_to_rendezvous():
    for module, targets in _imports().items():
        if module.startswith("rendezvous"):
            assert not [t for t in targets if t.startswith(("launcher", "elastic", "lighthouse"))], (module, targets)
        if module.startswith("launcher"):
            assert not [t for t in targets if t.startswith(("elastic", "lighthouse"))], (module, targets)
        if module.startswith("elastic"):
            assert not [t for t in targets if t.startswith("lighthouse")], (module, targets)


# launcher/: the spine (the agent's loop and what builds it) uses the parts (its subfolders), which use
# the utilities; a part never reaches back into the spine.
SPINE = (
    "agent",
    "api",
    "launch",
    "compose",
    "runner",
    "restart",
    "config",
    "plan",
    "nodecheck",
    "torchft_lighthouse",
)


def test_no_part_of_the_launcher_imports_its_spine():
    spine = {f"launcher.{name}" for name in SPINE}
    wrong = {
        m: sorted(t for t in targets if t in spine)
        for m, targets in _imports().items()
        if m.startswith("launcher.") and m.count(".") >= 2 and not m.startswith("launcher.cli.")
    }
    assert not {m: t for m, t in wrong.items() if t}, wrong


def test_the_lighthouse_uses_etcd_and_the_launchers_entry_only():
    """The Lighthouse is its own program: of the rest it imports the etcd layer, the settings, and the
    launcher's errors, signals and command entry (one exit-code table); nothing of jobs or rounds."""
    allowed = ("lighthouse", "rendezvous.errors", "rendezvous.etcd", "rendezvous.settings", "rendezvous.processes")
    allowed += ("launcher.errors",)
    allowed += ("launcher.signals", "launcher.cli.entry")
    parents = ("rendezvous", "launcher", "launcher.cli")
    wrong = {
        m: sorted(t for t in targets if not _allowed(t, allowed) and t not in parents)
        for m, targets in _imports().items()
        if m.startswith("lighthouse")
    }
    assert not {m: t for m, t in wrong.items() if t}, wrong


def test_the_lighthouse_program_loads_nothing_of_jobs_or_rounds():
    """What ``python -m lighthouse`` loads in all, the imports of its imports included (141 of the
    project's modules before its entry left ``launcher.cli.run``; 33 now)."""
    probe = textwrap.dedent(
        """
        import runpy, sys
        sys.argv = ["lighthouse", "--help"]
        try:
            runpy.run_module("lighthouse", run_name="__main__")
        except SystemExit:
            pass
        sys.stderr.write(" ".join(m for m in sys.modules if m.split(".")[0] in ("launcher", "rendezvous")))
        """
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    loaded = shown.stderr.split()
    allowed = ("launcher.errors", "launcher.signals", "launcher.cli.entry", "rendezvous.errors", "rendezvous.etcd")
    allowed += ("rendezvous.settings", "rendezvous.job.keys")
    parents = ("launcher", "launcher.cli", "rendezvous", "rendezvous.job")
    wrong = [m for m in loaded if not _allowed(m, allowed) and m not in parents]
    assert "launcher.errors" in loaded and not wrong, (wrong, shown.stderr[-2000:])


def _allowed(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("layer, allowed", LAYERS, ids=[layer for layer, _ in LAYERS])
def test_each_rendezvous_layer_imports_only_the_layers_below_it(layer, allowed):
    modules = {m: t for m, t in _imports().items() if m == layer or m.startswith(layer + ".")}
    assert modules, f"no module in {layer}"
    wrong = {
        m: sorted(t for t in targets if not _allowed(t, (layer, *allowed)) and t != "rendezvous")
        for m, targets in modules.items()
    }
    assert not {m: t for m, t in wrong.items() if t}, wrong


def test_the_layering_check_sees_a_wrong_import():
    """The check itself can fail: an etcd-layer module importing job data is caught."""
    graph = {"rendezvous.etcd.client": {"rendezvous.job.keys"}}
    layer, allowed = LAYERS[0]
    assert [t for t in graph["rendezvous.etcd.client"] if not _allowed(t, (layer, *allowed))] == ["rendezvous.job.keys"]


def test_only_the_command_lines_import_the_command_lines():
    """launcher.cli parses text and prints; the agent, the plan and the Python API import nothing of it
    (the Lighthouse's program takes its entry: one exit-code table for the three commands)."""
    outside = {
        name: sorted(t for t in targets if t == "launcher.cli" or t.startswith("launcher.cli."))
        for name, targets in _imports().items()
        if not (name == "launcher.cli" or name.startswith("launcher.cli.") or name == "lighthouse.__main__")
    }
    assert not {name: found for name, found in outside.items() if found}


# Reach-through: a part reading another part's configuration or state through it (the agent reading
# ``handler.settings.fence_after``, the runner ``handler.lease.overdue()``) instead of being handed
# the value by the root (``launcher.launch``, which composes the parts: ``JobTerms``). 16 sites
# before the rule; 0 allowed. Collaborator name -> the attributes that are its insides.
REACH_THROUGH = {"handler": ("settings", "lease"), "peers": ("timing", "missed")}
ROOTS = ("launcher.launch",)


def _last_name(node: ast.AST) -> str:
    """``x`` of ``x`` or ``a.b.x``; "" for anything else."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _reach_through(source: str) -> list[int]:
    """The lines of ``source`` that read a collaborator's insides (``REACH_THROUGH``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in REACH_THROUGH.get(_last_name(node.value).lstrip("_"), ()):
            found.append(node.lineno)
    return sorted(found)


def _launcher_sites(find, skip: tuple[str, ...] = ()) -> dict[str, list[int]]:
    """module -> the lines ``find(source)`` names in it, over launcher/ except the modules ``skip``."""
    modules = ((_module_name(p), p) for p in (ROOT / "launcher").rglob("*.py"))
    return {name: lines for name, path in modules if name not in skip and (lines := find(path.read_text()))}


def test_no_part_of_the_launcher_reads_another_parts_insides_through_it():
    sites = _launcher_sites(_reach_through, skip=ROOTS)
    assert sum(len(lines) for lines in sites.values()) == 0, sites


def test_the_reach_through_check_sees_one():
    source = "x = self.handler.settings.fence_after\ny = handler.lease.lost()\nz = self._peers.timing\n"
    source += "ok = self.lease\n"
    assert _reach_through(source) == [1, 2, 3]


# Read-backs: a part reading from the workers' environment a name another part wrote into it (the
# round runner read the checkpoint memory directory back from it). The root hands the value to
# whoever needs it; the environment only goes to the workers. 1 site before the rule; 0 allowed.
OURS = ("ELASTIC_", "TORCHELASTIC_")


def _read_backs(source: str) -> list[int]:
    """The lines of ``source`` that read one of our names from an ``environ`` other than os.environ."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            mapping, key = node.func.value, node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            mapping, key = node.value, node.slice
        else:
            continue
        workers_env = _last_name(mapping).lstrip("_") == "environ" and not (
            isinstance(mapping, ast.Attribute) and isinstance(mapping.value, ast.Name) and mapping.value.id == "os"
        )
        named = isinstance(key, ast.Name) and key.id.startswith("ENV_")
        spelled = isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith(OURS)
        if workers_env and (named or spelled):
            found.append(node.lineno)
    return sorted(found)


def test_no_part_of_the_launcher_reads_back_the_workers_environment():
    sites = _launcher_sites(_read_backs)
    assert sum(len(lines) for lines in sites.values()) == 0, sites


def test_the_read_back_check_sees_one():
    source = "a = self._environ.get(ENV_MEMORY)\nb = environ['TORCHELASTIC_RUN_ID']\nc = os.environ.get(ENV_MEMORY)\n"
    assert _read_backs(source) == [1, 2]


# Collaborators built outside the root: what lives as long as the agent is built once, by the root
# (``launcher.launch``, and ``launcher.compose`` for the agent's own parts), and handed in; the agent
# and the round runner construct per-round values only. 10 call sites before the rule (all in
# ``Agent._open``; the warm interpreter, the eleventh, had moved to the root already); 0
# allowed. The builders of the agent's long-lived collaborators:
LONG_LIVED = (
    "LogPump",
    "memory_dir",
    "InprocessHost",
    "Keeper",
    "starter_for",
    "WorkerGroup",
    "HealthGate",
    "CheckpointKeeper",
    "RoundRunner",
    "preflight_for",
    "HistoryWriter",
    "ReaperProcess",
    "StoreHost",
    "PeerProbes",
    "PaceBoard",
    "HangChannel",
    "RendezvousHandler",
    "Agent",
    "warm_starter",
)
COMPOSERS = ("launcher.launch", "launcher.compose")  # elastic-ctl's commands (launcher.cli) are roots of their own


def _defaults(tree: ast.AST) -> set[int]:
    """The calls that build a part's own default for an argument not given (``x if x is not None else B()``)."""
    return {
        id(node.orelse)
        for node in ast.walk(tree)
        if isinstance(node, ast.IfExp)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.ops[0], ast.IsNot)
        and isinstance(node.orelse, ast.Call)
    }


def _builds(source: str) -> list[int]:
    """The lines of ``source`` that call a builder of a long-lived collaborator (``LONG_LIVED``),
    itself or one of its class methods (``HealthGate.for_agent(...)``), other than a default or a
    builder the module defines itself (its own resource: ``CheckpointKeeper``'s memory directory)."""
    tree = ast.parse(source)
    defaults, found = _defaults(tree), []
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in defaults:
            continue
        func = node.func
        owner = _last_name(func.value) if isinstance(func, ast.Attribute) else ""
        name = _last_name(func) if _last_name(func) in LONG_LIVED else owner
        if name in LONG_LIVED and name not in own:
            found.append(node.lineno)
    return sorted(found)


def test_what_lives_as_long_as_the_agent_is_built_by_the_root_alone():
    sites = _launcher_sites(_builds, skip=COMPOSERS)
    assert sum(len(lines) for module, lines in sites.items() if not module.startswith("launcher.cli.")) == 0, sites


def test_the_builds_check_sees_one():
    source = "self._pump = LogPump()\ngate = HealthGate.for_agent(a, b)\nx = self._group.stop(1)\n"
    source += "rounds = runner.RoundRunner(config)\nk = keeper if keeper is not None else Keeper(None)\n"
    assert _builds(source) == [1, 2, 4]


# History record kinds: written and read as ``Kind`` members, never spelled (a renamed kind then
# fails at import, not silently in a report). A kind spelled as a string: the first argument of a
# ``record`` call, or a string compared with a ``kind``. 39 sites before the rule (in 13 modules of
# launcher/ and rendezvous/); 0 allowed. The reaper, run by path with no import of the package,
# spells its one kind, and that spelling is checked against ``Kind`` below.
def _spelled_kinds(source: str) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _last_name(node.func) in ("record", "_record") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(node.lineno)
        elif isinstance(node, ast.Compare) and _last_name(node.left).lstrip("_") == "kind":
            sides = [c for c in node.comparators for c in (c.elts if isinstance(c, ast.Tuple) else [c])]
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in sides):
                found.append(node.lineno)
    return sorted(found)


def _package_sites(find, packages=("launcher", "rendezvous"), skip: tuple[str, ...] = ()) -> dict[str, list[int]]:
    modules = ((_module_name(p), p) for package in packages for p in (ROOT / package).rglob("*.py"))
    return {name: lines for name, path in modules if name not in skip and (lines := find(path.read_text()))}


# Modules whose ``kind`` is another thing's: the c10d wire's field kinds, the reaper's message kinds,
# the hang cases' event kinds, a blame's kind, and a pre-flight finding's.
OTHER_KINDS = (
    "launcher.c10dstore.protocol",
    "launcher.reaper.wire",
    "launcher.hangs.cases",
    "launcher.hangs.blame",
    "launcher.preflight.pairs",
)


def test_history_record_kinds_are_never_spelled():
    sites = _package_sites(_spelled_kinds, skip=("launcher.reaper.reaper", *OTHER_KINDS))
    assert sum(len(lines) for lines in sites.values()) == 0, sites


def test_the_spelled_kinds_check_sees_one():
    source = 'h.record("job_closed", 1)\nif e.kind == "round_ended": pass\nif e.kind in ("a", Kind.B): pass\n'
    source += "h.record(Kind.JOB_CLOSED, 1)\nif e.kind == Kind.ROUND_ENDED: pass\n"
    assert _spelled_kinds(source) == [1, 2, 3]


def test_the_reaper_s_one_kind_and_every_kind_s_words_are_the_history_s():
    from launcher.cli.history_text import _EVENTS
    from rendezvous.job.history import Kind

    reaper = (ROOT / "launcher" / "reaper" / "reaper.py").read_text()
    assert f'"{Kind.NODE_LEFT.value}"' in reaper
    assert set(_EVENTS) == set(Kind), set(Kind) ^ set(_EVENTS)  # every kind has its words in `history`


def test_the_command_s_first_moments_load_the_option_table_and_its_parsers_alone():
    """``elastic-run``'s early start (the local etcd, the warm interpreter: ``launcher.cli.early``) reads
    the line with the option table and builds the worker's command with the same parser the plan uses
    (``launcher.options.values.worker_argv``), before the heavy imports: nothing else of the launcher."""
    probe = "import sys, launcher.cli.early; sys.stderr.write(' '.join(sys.modules))"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    loaded = [m for m in shown.stderr.split() if m.split(".")[0] in ("launcher", "rendezvous")]
    allowed = (
        "launcher.cli.early",
        "launcher.errors",
        "launcher.options",
        "launcher.workers.numa",
        "rendezvous.errors",
    )
    parents = ("launcher", "launcher.cli", "launcher.workers", "rendezvous")
    wrong = [m for m in loaded if not _allowed(m, allowed) and m not in parents]
    assert "launcher.options.values" in loaded and not wrong, (wrong, shown.stderr[-2000:])


def _spelled_env_names(source: str) -> list[int]:
    """The lines of ``source`` that spell a ``TORCHELASTIC_*`` name as a value (docstrings, help and
    messages that name one aside)."""
    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        if node.value.startswith("TORCHELASTIC_") and not any(c.isspace() for c in node.value)  # a name, not prose
    )


def test_torch_s_environment_names_are_spelled_once():
    """``TORCHELASTIC_*`` is spelled in ``launcher.envnames`` alone (it was in 6 modules, up to 4
    times each): the agent that exports, the worker that reads and the log specs use the same names."""
    sites = _package_sites(_spelled_env_names, packages=PACKAGES, skip=("launcher.envnames",))
    assert sum(len(lines) for lines in sites.values()) == 0, sites


def test_the_spelled_env_names_check_sees_one():
    source = '"""Reads TORCHELASTIC_RUN_ID."""\nx = env["TORCHELASTIC_RUN_ID"]\ny = env[envnames.RUN_ID]\n'
    source += 'raise E("TORCHELASTIC_RUN_ID is not set")\nk.startswith("TORCHELASTIC_")\n'
    assert _spelled_env_names(source) == [2, 5]
