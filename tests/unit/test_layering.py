"""The packages' imports: no cycle between modules, and the direction elastic -> launcher -> rendezvous
(the etcd layer of rendezvous knowing nothing of jobs)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("elastic", "launcher", "rendezvous")
ETCD_LAYER = ("client", "endpoints", "txn", "retry", "streams", "watch", "session", "etcd_server", "lifeline", "ports",
              "errors")


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
                return stack[stack.index(nxt):] + [nxt]
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


def test_imports_point_from_elastic_to_launcher_to_rendezvous():
    for module, targets in _imports().items():
        if module.startswith("rendezvous"):
            assert not [t for t in targets if t.startswith(("launcher", "elastic"))], (module, targets)
        if module.startswith("launcher"):
            assert not [t for t in targets if t.startswith("elastic")], (module, targets)
