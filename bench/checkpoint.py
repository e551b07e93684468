"""elastic.checkpoint against torch.save to a disk, side by side in one worker under elastic-run.

    python bench/checkpoint.py [--mb 100] [--repeat 5]

One worker (``elastic-run --standalone``) holds a state of --mb megabytes (float32 tensors, as a
model's state_dict) and, in turn: ``elastic.checkpoint.save`` (into the agent's shared memory),
``torch.save`` to a file in a directory on disk (this checkout's ``bench/`` folder's filesystem),
then loads each back (``elastic.checkpoint.load`` vs ``torch.load(weights_only=True)``). Medians of
--repeat; the ratios are disk over memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(mb: int, repeat: int) -> None:
    import torch

    import elastic.checkpoint as ckpt

    tensors = 10
    state = {f"layer{i}.weight": torch.randn(mb * 1024 * 1024 // 4 // tensors) for i in range(tensors)}
    state["step"] = 0
    disk = tempfile.mkdtemp(prefix="ckpt-bench-", dir=HERE)
    times: dict[str, list[float]] = {"save memory": [], "save disk": [], "load memory": [], "load disk": []}
    try:
        path = os.path.join(disk, "state.pt")
        calls = {
            "save memory": lambda: ckpt.save(state, step=state["step"]),
            "save disk": lambda: (torch.save(state, path), os.sync()),
            "load memory": lambda: _touch(ckpt.load()),
            "load disk": lambda: _touch(torch.load(path, weights_only=True)),
        }
        for step in range(repeat):
            state["step"] = step
            for name, call in calls.items():
                times[name].append(_timed(call))
    finally:
        for name in os.listdir(disk):
            os.remove(os.path.join(disk, name))
        os.rmdir(disk)
    print(json.dumps({name: statistics.median(values) for name, values in times.items()}))


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _touch(state) -> None:
    """Read every tensor once, so a lazily mapped load is timed for what a restore costs."""
    for value in state.values():
        if hasattr(value, "sum"):
            value.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mb, args.repeat)
        return
    run = os.path.join(os.path.dirname(sys.executable), "elastic-run")
    command = [run, "--standalone", "--nproc-per-node", "1", __file__, "--worker", "--mb", str(args.mb)]
    done = subprocess.run([*command, "--repeat", str(args.repeat)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"the worker failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"state of {args.mb} MB, medians of {args.repeat}:")
    print("| | elastic.checkpoint (memory) | torch.save / torch.load (disk) | disk / memory |")
    print("| --- | --- | --- | --- |")
    for what in ("save", "load"):
        memory, disk = result[f"{what} memory"], result[f"{what} disk"]
        print(f"| {what} | {memory * 1000:.0f} ms | {disk * 1000:.0f} ms | {disk / memory:.1f}x |")


if __name__ == "__main__":
    main()
