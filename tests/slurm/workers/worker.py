"""A worker for the SLURM tests: writes <out>/<rank>.<restart>.<pid> when it starts, <out>/<rank>.usr1
when SIGUSR1 reaches it (and goes on), and runs --run seconds (until <out>/stop exists, if sooner)."""

import os
import signal
import sys
import time

out, run = sys.argv[1], float(sys.argv[2])
rank, restarts = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
open(os.path.join(out, f"{rank}.{restarts}.{os.getpid()}"), "w").write(os.environ["WORLD_SIZE"])
signal.signal(signal.SIGUSR1, lambda *_: open(os.path.join(out, f"{rank}.usr1"), "w").close())
print(f"rank {rank} of {os.environ['WORLD_SIZE']}, restart {restarts}", flush=True)
deadline = time.monotonic() + run
while time.monotonic() < deadline and not os.path.exists(os.path.join(out, "stop")):
    time.sleep(0.1)
