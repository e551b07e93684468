"""torchft's own tests of its Lighthouse (``lighthouse_test.py``) and of Managers training DDP through
one (``manager_integ_test.py``), as the torchft 0.2.0 wheel ships them, run against
``elastic-lighthouse``: their ``LighthouseServer`` is a shim that starts one on the test etcd.
Against torchft's own server they give 11 passed, 3 skipped (CUDA, torchcomms) on CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[torchft]')")
pytest.importorskip("parameterized", reason="torchft's tests need parameterized (pip install -e '.[torchft]')")

import torchft.lighthouse_test as lighthouse_test  # noqa: E402
import torchft.manager_integ_test as manager_integ_test  # noqa: E402

from .replicas import lighthouse_server_shim  # noqa: E402

TestLighthouse = lighthouse_test.TestLighthouse
ManagerIntegTest = manager_integ_test.ManagerIntegTest


@pytest.fixture(autouse=True)
def served_from_etcd(etcd_endpoints, tmp_path, monkeypatch):
    started: list = []
    shim = lighthouse_server_shim(etcd_endpoints, tmp_path, started)
    for module in (lighthouse_test, manager_integ_test):
        monkeypatch.setattr(module, "LighthouseServer", shim)
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
