"""What installing the package costs a torchrun that does not use it, side by side in one run.

    python bench/torchrun_entry.py [--repeat 5]

torch loads every ``torchrun.handlers`` entry point when a torchrun starts. Measured: a fresh
interpreter importing torchrun's module (``torch.distributed.run``, which loads the entry points)
as it is now, against the same import plus the etcd-v3 handler module, which the entry point used
to import at once (gRPC, the etcd client, the rounds). Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

NOW = "import torch.distributed.run"
BEFORE = NOW + "; import rendezvous.torchrun.plugin"


def timed(code: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    timed(NOW, 1)  # warm the file cache
    now, before = timed(NOW, args.repeat), timed(BEFORE, args.repeat)
    print(f"torchrun's import with the package's entry point now:    {now:.3f} s")
    print(f"... with the handler imported at once, as before:        {before:.3f} s ({before - now:+.3f} s)")


if __name__ == "__main__":
    main()
