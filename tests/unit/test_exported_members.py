"""Every public module declares __all__, and each name in it exists."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rendezvous", "launcher", "elastic")
# Programs run as processes (``python -m`` or by path), not imported: they export nothing.
PROGRAMS = ("launcher.workers.fn_worker", "launcher.reaper.reaper", "launcher.gpuprobe")
TORCH_MODULES = ("rendezvous.torchrun.plugin",)  # imports torch: checked where torch is installed


def _modules() -> list[str]:
    """Every module of the packages (a sub-package whose __init__ holds only its docstring exports nothing)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                if len(parts) > 1 or package == "launcher":
                    continue  # a docstring, nothing to export
            name = ".".join(parts)
            if name not in PROGRAMS + TORCH_MODULES:
                found.append(name)
    return found


MODULES = _modules()


@pytest.mark.parametrize("name", MODULES)
def test_module_exports_exist(name):
    module = importlib.import_module(name)
    assert module.__all__, f"{name} has an empty __all__"
    for member in module.__all__:
        assert hasattr(module, member), f"{name}.__all__ names missing {member}"


@pytest.mark.parametrize("name", TORCH_MODULES)
def test_torch_module_exports_exist(name):
    pytest.importorskip("torch")
    test_module_exports_exist(name)


def test_package_re_exports_its_errors():
    import rendezvous
    import rendezvous.errors

    for member in rendezvous.errors.__all__:
        assert getattr(rendezvous, member) is getattr(rendezvous.errors, member)


# A Python function entrypoint (launcher.api) goes to its workers as a pickle in a file the launching
# process wrote, and their return values come back the same way, as torch's spawn does: nothing in
# these files touches etcd, and nothing read from etcd is ever unpickled.
PICKLE_BETWEEN_PARENT_AND_CHILD = ("api.py", "fn_worker.py", "payload.py")


def test_no_module_imports_torch_or_pickle():
    import subprocess
    import sys
    from pathlib import Path

    # In a fresh interpreter: other tests of this session may have imported torch already.
    code = f"import importlib, sys; [importlib.import_module(m) for m in {MODULES!r}]; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    root = Path(__file__).resolve().parents[2]
    for path in (
        list((root / "rendezvous").rglob("*.py"))
        + list((root / "elastic").rglob("*.py"))
        + list((root / "launcher").rglob("*.py"))
    ):
        text = path.read_text()
        if path.name in PICKLE_BETWEEN_PARENT_AND_CHILD:
            assert (
                "pickle.loads" not in text and "from rendezvous" not in text.split('"""', 2)[2].split("def ", 1)[0]
            ), path
            continue
        # pickletools (rendezvous/torchrun/torchstate.py) reads opcodes and builds plain data only
        assert not re.search(r"import pickle\b|from pickle\b", text) and "pickle.loads" not in text, path
        assert "Unpickler" not in text and "pickle.load(" not in text, path


def test_every_module_is_checked():
    assert len(MODULES) > 60 and "rendezvous.etcd.client" in MODULES and "launcher.cli.run" in MODULES


def test_only_the_torch_plugin_imports_torch():
    """And launcher/output/torch_specs.py, inside the function that builds a torch LogsSpecs named by
    --logs-specs (such a class is torch's), and elastic/checkpoint.py inside the worker's save and
    load (torch.save's format), and launcher/gpuprobe.py, the health gate's GPU check (a program a child
    interpreter runs); the agent never imports either otherwise."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for package in ("rendezvous", "launcher", "elastic"):
        for path in (root / package).rglob("*.py"):
            if path.relative_to(root).as_posix() == "rendezvous/torchrun/plugin.py":
                continue
            text = path.read_text()
            if path.name in ("torch_specs.py", "checkpoint.py", "gpuprobe.py", "pace.py", "probe.py"):
                assert not any(line.startswith(("import torch", "from torch")) for line in text.splitlines()), path
                continue
            assert "import torch" not in text and "from torch" not in text, path
