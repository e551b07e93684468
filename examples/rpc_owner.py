"""torch.distributed.rpc over the launcher's environment: rank 0 asks "worker1" to create a tensor
and gets back an RRef owned by worker1.

    elastic-run --standalone --nproc-per-node 2 examples/rpc_owner.py

init_rpc reads MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE from the environment elastic-run sets.
With a builtin operator such as torch.ones the size goes as a tuple: args=((10,),); args=(10,)
fails torch's schema match.
"""

import torch
import torch.distributed.rpc as rpc

import elastic


@elastic.record
def main() -> None:
    env = elastic.WorkerEnv.from_environ()
    rpc.init_rpc(f"worker{env.rank}", rank=env.rank, world_size=env.world_size)
    if env.rank == 0:
        rref = rpc.remote("worker1", torch.ones, args=((10,),))
        owner = rref.owner_name()
        total = rref.to_here().sum().item()
        if owner != "worker1" or total != 10:
            raise RuntimeError(f"unexpected RRef: owner {owner}, sum {total}")
        print(f"rank 0: RRef owner {owner}, to_here().sum() = {total:g}", flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    main()
