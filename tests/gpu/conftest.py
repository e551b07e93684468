import os
import shutil

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0 numpy)")

# Asked without creating a CUDA context in the test process: the device node and a CUDA build of torch.
WHY_NOT = (
    "no NVIDIA GPU here (/dev/nvidia0)"
    if not os.path.exists("/dev/nvidia0")
    else "this torch is a CPU build"
    if torch.version.cuda is None
    else "no nvidia-smi on PATH"
    if shutil.which("nvidia-smi") is None
    else None
)


def pytest_collection_modifyitems(config, items):
    if WHY_NOT is None:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {WHY_NOT}"))
