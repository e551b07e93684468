import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0 numpy)")
