"""Every rank adds rank+1 with a gloo all_reduce and prints the sum (the same on every rank).

elastic-run --standalone --nproc-per-node 2 examples/allreduce.py
torchrun --rdzv-backend etcd-v3 --rdzv-endpoint HOST:PORT --rdzv-id ID --nnodes 2 --nproc-per-node 2 \
    examples/allreduce.py
"""

import torch
import torch.distributed as dist

import elastic


@elastic.record
def main() -> None:
    dist.init_process_group("gloo")
    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: all_reduce sum {int(value.item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
