"""Prints whether torch and etcd-elastic both see this process as launched by an elastic agent.

python examples/is_launched.py                                    -> False False
elastic-run --standalone --nproc-per-node 2 examples/is_launched.py  -> True True (each rank)
"""

import torch.distributed as dist

import elastic

print(f"torch={dist.is_torchelastic_launched()} elastic={elastic.is_torchelastic_launched()}", flush=True)
