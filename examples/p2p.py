"""A ring of point-to-point messages: each rank isend()s to the next and irecv()s from the previous,
waits on both returned Work objects, and checks the value it got.

    elastic-run --standalone --nproc-per-node 3 examples/p2p.py
"""

import torch
import torch.distributed as dist

import elastic


@elastic.record
def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        outgoing = torch.tensor([rank * 100.0 + step])
        incoming = torch.zeros(1)
        send = dist.isend(outgoing, dst=(rank + 1) % world)
        recv = dist.irecv(incoming, src=(rank - 1) % world)
        send.wait()
        recv.wait()
        expected = ((rank - 1) % world) * 100.0 + step
        if incoming.item() != expected:
            raise RuntimeError(f"rank {rank} step {step}: got {incoming.item()}, expected {expected}")
    print(f"rank {rank}: ring of {world} ok (3 rounds of isend/irecv)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
