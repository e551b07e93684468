"""torchft's own tests of its Lighthouse (``lighthouse_test.py``) and of Managers training DDP through
one (``manager_integ_test.py``), as the torchft 0.2.0 wheel ships them, run against
``elastic-lighthouse``: their ``LighthouseServer`` is a shim that starts one on the test etcd.
Against torchft's own server they give 11 passed, 3 skipped (CUDA, torchcomms) on CPU."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[torchft]')")
pytest.importorskip("parameterized", reason="torchft's tests need parameterized (pip install -e '.[torchft]')")

import torchft.lighthouse_test as lighthouse_test  # noqa: E402
import torchft.manager_integ_test as manager_integ_test  # noqa: E402

from .replicas import lighthouse_server_shim  # noqa: E402

TestLighthouse = lighthouse_test.TestLighthouse
ManagerIntegTest = manager_integ_test.ManagerIntegTest


class _SameModel(manager_integ_test.MyModel):
    """The suite's model, every replica's built with the first one's weights. The suite's replicas are
    threads of one process, each seeding the one generator (``torch.manual_seed(42)``) and building
    ``MyModel`` under a lock -- while a replica already training draws its inputs from that generator
    outside it: on a loaded machine the second model differs, and ``test_ddp_skip_init_sync`` (no
    initial sync: the same seed must give the same model) fails whatever serves the quorum (CI:
    layers.0.bias 1.04 apart, more than 4 Adam steps can move it). Same seed, same model, as meant."""

    _building = threading.Lock()
    _first: dict | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        with _SameModel._building:
            if _SameModel._first is None:
                _SameModel._first = {name: value.clone() for name, value in self.state_dict().items()}
            else:
                self.load_state_dict(_SameModel._first)


@pytest.fixture(autouse=True)
def served_from_etcd(etcd_endpoints, tmp_path, monkeypatch):
    started: list = []
    shim = lighthouse_server_shim(etcd_endpoints, tmp_path, started)
    for module in (lighthouse_test, manager_integ_test):
        monkeypatch.setattr(module, "LighthouseServer", shim)
    monkeypatch.setattr(manager_integ_test, "MyModel", _SameModel)
    monkeypatch.setattr(_SameModel, "_first", None)  # each test's replicas their own
    yield started
    for replica in started:
        replica.kill()


def test_the_shim_is_what_the_suites_use(served_from_etcd):
    """The suites above ran against elastic-lighthouse, not torchft's server."""
    server = lighthouse_test.LighthouseServer(bind="[::]:0", min_replicas=1)
    try:
        assert served_from_etcd == [server]
        assert "Lighthouse listening on" in server.output()
    finally:
        server.shutdown()
