"""A worker forked from the warm interpreter the moment its imports end: the importing thread's
exit (its C-level thread-local destructors: MKL frees the thread's buffers under a spinlock) is over
before the fork, so no child inherits a lock held and spins forever in its first matrix multiply."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORKS = 200

# The zygote's own import step, then a fork at once, FORKS times: the preloaded module multiplies
# matrices at import (its thread gets MKL buffers), the child multiplies too, with 10 s to do it.
LOOP = """
import json, os, signal, socket, sys
sys.path.insert(0, sys.argv[1])
from launcher.warmstart import zygote
import torch

stuck, unsafe = 0, set()
ours, theirs = socket.socketpair()
for _ in range(int(sys.argv[2])):
    sys.modules.pop("mkl_at_import", None)
    loaded, failed, _out, _err, importer = zygote._preload_aside(["mkl_at_import"], theirs)
    assert loaded == ["mkl_at_import"], failed
    unsafe.add(zygote._unsafe(importer))
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)
        b = torch.randn(128, 128)
        (b @ b).sum().item()
        os._exit(0)
    stuck += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
print(json.dumps({"stuck": stuck, "unsafe": sorted(unsafe)}))
"""


def test_no_worker_forked_right_after_the_imports_spins_in_its_first_matrix_multiply(tmp_path):
    (tmp_path / "mkl_at_import.py").write_text("import torch\na = torch.randn(64, 64)\n(a @ a).sum().item()\n")
    done = subprocess.run(
        [sys.executable, "-c", LOOP, str(tmp_path), str(FORKS)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"stuck": 0, "unsafe": [""]}, f"{found['stuck']} of {FORKS} forked children stuck"
