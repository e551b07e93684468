"""Every public module declares __all__, and each name in it exists."""

import importlib

import pytest

MODULES = [
    "rendezvous", "rendezvous.errors", "rendezvous.client", "rendezvous.backend", "rendezvous.state",
    "rendezvous.decide", "rendezvous.settings", "rendezvous.membership", "rendezvous.handler",
    "rendezvous.watch", "rendezvous.etcd_server", "rendezvous.lifeline", "rendezvous.view", "elastic",
    "elastic.jobstate", "elastic.worker", "elastic.record", "launcher.env", "launcher.errors", "launcher.errorfile",
    "launcher.logs", "launcher.workers", "launcher.summary", "launcher.agent", "launcher.options", "launcher.cli",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_exports_exist(name):
    module = importlib.import_module(name)
    assert module.__all__, f"{name} has an empty __all__"
    for member in module.__all__:
        assert hasattr(module, member), f"{name}.__all__ names missing {member}"


def test_package_re_exports_its_errors():
    import rendezvous
    import rendezvous.errors

    for member in rendezvous.errors.__all__:
        assert getattr(rendezvous, member) is getattr(rendezvous.errors, member)


def test_no_module_imports_torch_or_pickle():
    import sys

    for name in MODULES:
        importlib.import_module(name)
    assert "torch" not in sys.modules
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in list((root / "rendezvous").glob("*.py")) + list((root / "elastic").glob("*.py")) + list((root / "launcher").glob("*.py")):
        text = path.read_text()
        assert "import pickle" not in text and "pickle.loads" not in text, path
