"""A training loop for the hang tests: a step every --step seconds, then elastic.heartbeat().

--hang R:S      rank R stops in step S (in ``stuck_in_step``, before that step's heartbeat), on the
                first attempt only unless --every-attempt
--gloo          an all_reduce after each heartbeat (torch, gloo): the peers block behind a stopped rank
--skip R:S      rank R skips step S's all_reduce and waits for a message rank 0 never sends (a deadlock)
--phase R:S:D:T rank R (or "all") spends D seconds in elastic.phase("checkpoint", timeout=T) in step S
--tail R:D      rank R works D seconds after its last step (a final save, outside any phase)
--no-api        never call the API (the agent must leave such a worker alone)
--out DIR       DIR/<rank>.<attempt>.beat holds the wall time of the last heartbeat; <rank>.<attempt>.done
                is touched at the end
"""

import argparse
import os
import time

import elastic

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step", type=float, default=0.2)
parser.add_argument("--hang", default="")
parser.add_argument("--every-attempt", action="store_true")
parser.add_argument("--gloo", action="store_true")
parser.add_argument("--skip", default="")
parser.add_argument("--phase", default="")
parser.add_argument("--tail", default="")
parser.add_argument("--no-api", action="store_true")
parser.add_argument("--out", default="")
args = parser.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def at(spec):
    """(rank, step) from "R:S", or None."""
    return tuple(int(x) for x in spec.split(":")[:2]) if spec else None


def stuck_in_step(seconds):
    time.sleep(seconds)


def waiting_for_a_message_never_sent(dist, t):
    dist.recv(t, src=0)


if args.gloo or args.skip:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1)

hang, skip = at(args.hang), at(args.skip)
phase = args.phase.split(":") if args.phase else None
for step in range(args.steps):
    if hang == (rank, step) and (attempt == 0 or args.every_attempt):
        stuck_in_step(3600)
    if phase and int(phase[1]) == step and phase[0] in ("all", str(rank)):
        with elastic.phase("checkpoint", timeout=float(phase[3])):
            time.sleep(float(phase[2]))
    time.sleep(args.step)
    if not args.no_api:
        elastic.heartbeat()
        if args.out:
            with open(os.path.join(args.out, f"{rank}.{attempt}.beat"), "w") as handle:
                handle.write(repr(time.time()))
    if skip == (rank, step) and attempt == 0:
        waiting_for_a_message_never_sent(dist, tensor)
    elif args.gloo or args.skip:
        dist.all_reduce(tensor)
if args.tail and int(args.tail.split(":")[0]) == rank:
    time.sleep(float(args.tail.split(":")[1]))
if args.gloo or args.skip:
    dist.destroy_process_group()  # without it, gloo's teardown at exit can fail the first rank to leave
if args.out:
    open(os.path.join(args.out, f"{rank}.{attempt}.done"), "w").close()
