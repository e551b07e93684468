"""A worker forked from the warm interpreter the moment its imports end: the importing thread stays,
idle, and so do the OpenMP threads it started, so that no thread is running its C-level thread-local
destructors at the fork (MKL's frees the thread's buffers under a spinlock): no child inherits a lock
held and spins forever in its first matrix multiply."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORKS = 200

# The zygote's own import step, then a fork at once, FORKS times: the preloaded module multiplies
# matrices at import (its thread gets MKL buffers), the child multiplies too. A child not done in
# STUCK_AFTER seconds is stuck: its CPU time (a spinning child's grows) and native stacks are told.
LOOP = """
import json, os, socket, sys, time
sys.path.insert(0, sys.argv[1])
from launcher.warmstart import zygote
from tests.faults.helpers import native_stacks
import torch

stuck, unsafe = [], set()
ours, theirs = socket.socketpair()
for _ in range(int(sys.argv[2])):
    sys.modules.pop("mkl_at_import", None)
    loaded, failed, _out, _err, importer = zygote._preload_aside(["mkl_at_import"], theirs)
    assert loaded == ["mkl_at_import"], failed
    if not unsafe:  # the first: a warm interpreter imports once (the idle importers of the others stay)
        unsafe.add(zygote._unsafe(importer))
    pid = os.fork()
    if pid == 0:
        b = torch.randn(128, 128)
        (b @ b).sum().item()
        os._exit(0)
    deadline = time.monotonic() + float(sys.argv[3])
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            with open(f"/proc/{pid}/stat") as stat:
                cpu = sum(map(int, stat.read().rsplit(")", 1)[1].split()[11:13])) / os.sysconf("SC_CLK_TCK")
            stuck.append(f"child {pid}, {cpu:.1f} s of CPU in {sys.argv[3]} s: {native_stacks(pid)}")
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.005)
print(json.dumps({"stuck": stuck, "unsafe": sorted(unsafe)}))
"""
STUCK_AFTER = 30


def test_no_worker_forked_right_after_the_imports_spins_in_its_first_matrix_multiply(tmp_path):
    (tmp_path / "mkl_at_import.py").write_text("import torch\na = torch.randn(64, 64)\n(a @ a).sum().item()\n")
    done = subprocess.run(
        [sys.executable, "-c", LOOP, str(tmp_path), str(FORKS), str(STUCK_AFTER)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["unsafe"] == [""], found["unsafe"]
    assert not found["stuck"], f"{len(found['stuck'])} of {FORKS} forked children stuck:\n" + "\n".join(found["stuck"])
