"""A worker for the end-to-end tests. Behaviour by flags:

    probe.py OUT_DIR [--fail-until N] [--run SECONDS] [--grandchild] [--trap-term]

Writes OUT_DIR/<restart>-<rank>.json with its environment and pid; fails (ValueError) while
TORCHELASTIC_RESTART_COUNT < N; runs for SECONDS (ticking a heartbeat file); --grandchild starts a
`sleep` child whose pid it records; --trap-term records a SIGTERM before exiting.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import elastic

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-until", type=int, default=0)
parser.add_argument("--run", type=float, default=0.0)
parser.add_argument("--grandchild", action="store_true")
parser.add_argument("--trap-term", action="store_true")
args = parser.parse_args()


@elastic.record
def main() -> None:
    env = elastic.WorkerEnv.from_environ()
    name = f"{env.restart_count}-{env.rank}"
    record = {"env": dict(os.environ), "pid": os.getpid(), "argv": sys.argv[1:]}
    if args.grandchild:
        record["grandchild"] = subprocess.Popen(["sleep", "600"]).pid
    if args.trap_term:

        def on_term(signum, frame):
            with open(os.path.join(args.out, f"{name}.term"), "w") as handle:
                handle.write("SIGTERM")
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(args.out, f"{name}.json.tmp"), "w") as handle:
        json.dump(record, handle)
    os.replace(os.path.join(args.out, f"{name}.json.tmp"), os.path.join(args.out, f"{name}.json"))
    # one write per line (print writes the newline apart): ranks share the console, tests read it line by line
    sys.stdout.write(f"worker rank {env.rank} of {env.world_size} restart {env.restart_count}\n")
    sys.stdout.flush()
    if env.restart_count < args.fail_until and env.rank == 1:
        raise ValueError(f"planned failure of rank {env.rank} at restart {env.restart_count}")
    deadline = time.monotonic() + args.run
    while time.monotonic() < deadline:
        with open(os.path.join(args.out, f"beat-{env.rank}"), "w") as handle:
            handle.write(str(time.time()))
        time.sleep(0.05)


main()
