"""A training loop for the hang tests: a step of --step seconds of work, elastic.heartbeat(), and
with --gloo the step's collectives (an all_reduce, then a broadcast; torch, gloo).

--place P       where the heartbeat is: "before" the step's collectives (the default), "after" them
                (then every rank beats within a few ms of the others: a tie), or "both"
--hang R:S[:between]  rank R stops in step S (in ``stuck_in_step``, plain Python: before the step's
                work, or between its all_reduce and its broadcast), on the first attempt only unless
                --every-attempt
--busy          the stopped rank spins (a busy hang: it computes and never beats) instead of sleeping
--gloo          the collectives: the peers block behind a stopped rank
--skip R:S      rank R skips step S's collectives and waits for a message rank 0 never sends (a deadlock)
--mismatch R:S  rank R calls the broadcast in step S while the others are in the all_reduce (a deadlock)
--phase R:S:D:T rank R (or "all") spends D seconds in elastic.phase("checkpoint", timeout=T) in step S
--tail R:D      rank R works D seconds after its last step (a final save, outside any phase), on the
                first attempt only unless --every-attempt; with --tail-after-done it beats on until rank
                0's done file is there (its peer finished), then works D seconds
--no-api        never call the API (the agent must leave such a worker alone)
--linger S      S seconds more after the loop, on attempts after the first (time to look at the agent)
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
parser.add_argument("--place", choices=("before", "after", "both"), default="before")
parser.add_argument("--mismatch", default="")
parser.add_argument("--every-attempt", action="store_true")
parser.add_argument("--busy", action="store_true")
parser.add_argument("--gloo", action="store_true")
parser.add_argument("--skip", default="")
parser.add_argument("--phase", default="")
parser.add_argument("--tail", default="")
parser.add_argument("--tail-after-done", action="store_true")
parser.add_argument("--no-api", action="store_true")
parser.add_argument("--out", default="")
parser.add_argument("--linger", type=float, default=0.0)
args = parser.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def at(spec):
    """(rank, step) from "R:S", or None."""
    return tuple(int(x) for x in spec.split(":")[:2]) if spec else None


def beat():
    if not args.no_api:
        elastic.heartbeat()
        if args.out:
            with open(os.path.join(args.out, f"{rank}.{attempt}.beat"), "w") as handle:
                handle.write(repr(time.time()))


def stuck_in_step(seconds):
    end = time.monotonic() + seconds
    while args.busy and time.monotonic() < end:
        pass
    time.sleep(max(0.0, end - time.monotonic()))


def waiting_for_a_message_never_sent(dist, t):
    dist.recv(t, src=0)


if args.gloo or args.skip or args.mismatch:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1)

hang, skip, mismatch = at(args.hang), at(args.skip), at(args.mismatch)
between = args.hang.endswith(":between")
phase = args.phase.split(":") if args.phase else None
first = attempt == 0 or args.every_attempt
for step in range(args.steps):
    if hang == (rank, step) and first and not between:
        stuck_in_step(3600)
    if phase and int(phase[1]) == step and phase[0] in ("all", str(rank)):
        with elastic.phase("checkpoint", timeout=float(phase[3])):
            time.sleep(float(phase[2]))
    time.sleep(args.step)
    if args.place in ("before", "both"):
        beat()
    if skip == (rank, step) and attempt == 0:
        waiting_for_a_message_never_sent(dist, tensor)
    elif args.gloo or args.skip or args.mismatch:
        if mismatch != (rank, step) or attempt != 0:
            dist.all_reduce(tensor)
        if hang == (rank, step) and first and between:
            stuck_in_step(3600)
        dist.broadcast(tensor, src=0)
    if args.place in ("after", "both"):
        beat()
if args.tail and int(args.tail.split(":")[0]) == rank and first:
    peer_done = os.path.join(args.out, f"0.{attempt}.done")
    while args.tail_after_done and not os.path.exists(peer_done):
        time.sleep(args.step)
        beat()
    if args.tail_after_done:
        time.sleep(1.0)  # its agent's word that it finished reaches this node's agent
        beat()
    time.sleep(float(args.tail.split(":")[1]))
if attempt > 0:
    time.sleep(args.linger)
if args.gloo or args.skip or args.mismatch:
    dist.destroy_process_group()  # without it, gloo's teardown at exit can fail the first rank to leave
if args.out:
    open(os.path.join(args.out, f"{rank}.{attempt}.done"), "w").close()
