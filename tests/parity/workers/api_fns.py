"""Worker functions for the launch API cases, run under torch's elastic_launch and ours alike."""

import os
import time


def simple_rank_scale():
    """torch's api_test: each rank returns 10 + its rank."""
    return 10 + int(os.environ["RANK"])


def function_with_bug():
    raise RuntimeError("test error")


def rank_and_restart(marker_dir):
    """Rank 1 fails on the first attempt only; every rank returns (rank, restart count)."""
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if rank == 1 and restart == 0:
        open(os.path.join(marker_dir, "failed-once"), "w").close()
        raise ValueError("rank 1 fails on its first attempt")
    return rank, restart


def dist_sum(wait=0):
    """torch's api_test: a gloo all_reduce of the ranks."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    dist.init_process_group(backend="gloo")
    tensor = torch.tensor(rank)
    time.sleep(wait)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    dist.destroy_process_group()
    return tensor.item()
