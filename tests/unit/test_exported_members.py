"""Every public module declares __all__, and each name in it exists."""

import importlib

import pytest

MODULES = [
    "rendezvous", "rendezvous.errors", "rendezvous.client", "rendezvous.endpoints", "rendezvous.txn", "rendezvous.keys", "rendezvous.backend", "rendezvous.state",
    "rendezvous.decide", "rendezvous.settings", "rendezvous.membership", "rendezvous.handler",
    "rendezvous.watch", "rendezvous.etcd_server", "rendezvous.lifeline", "rendezvous.view", "rendezvous.kvstore", "rendezvous.ports", "elastic",
    "elastic.jobstate", "elastic.worker", "elastic.record", "launcher.env", "launcher.errors", "launcher.errorfile",
    "launcher.output", "launcher.output.plan", "launcher.output.default", "launcher.output.torch_specs",
    "launcher.output.pump", "launcher.workers", "launcher.summary", "launcher.agent", "launcher.api", "elastic.launch", "launcher.console", "launcher.signals", "launcher.launch", "launcher.options", "launcher.cli", "launcher.ctl",
    "rendezvous.jobstore", "rendezvous.join", "rendezvous.hangcase", "rendezvous.history", "rendezvous.operate",
    "elastic.heartbeat", "launcher.beatfile", "launcher.hangs", "launcher.hangwatch", "launcher.rounds", "launcher.config",
    "launcher.metrics", "launcher.health", "launcher.probes",
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


# A Python function entrypoint (launcher.api) goes to its workers as a pickle in a file the launching
# process wrote, and their return values come back the same way, as torch's spawn does: nothing in
# these files touches etcd, and nothing read from etcd is ever unpickled.
PICKLE_BETWEEN_PARENT_AND_CHILD = ("api.py", "fn_worker.py")


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
    for path in list((root / "rendezvous").rglob("*.py")) + list((root / "elastic").rglob("*.py")) + list((root / "launcher").rglob("*.py")):
        text = path.read_text()
        if path.name in PICKLE_BETWEEN_PARENT_AND_CHILD:
            assert "pickle.loads" not in text and "from rendezvous" not in text.split('"""', 2)[2].split("def ", 1)[0], path
            continue
        assert "import pickle" not in text and "pickle.loads" not in text, path


def test_only_the_torch_plugin_imports_torch():
    """And launcher/output/torch_specs.py, inside the function that builds a torch LogsSpecs named by
    --logs-specs (such a class is torch's); the agent never imports it otherwise."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for package in ("rendezvous", "launcher", "elastic"):
        for path in (root / package).rglob("*.py"):
            if path.name == "torch_plugin.py":
                continue
            text = path.read_text()
            if path.name == "torch_specs.py":
                assert not any(line.startswith(("import torch", "from torch")) for line in text.splitlines()), path
                continue
            assert "import torch" not in text and "from torch" not in text, path
