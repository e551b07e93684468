"""RPC timeouts: a default from TensorPipeRpcBackendOptions(rpc_timeout=seconds) and a per-call
``timeout=``. A remote call that runs past its timeout raises RuntimeError (torch has no
RpcTimeoutError class); its message says the call timed out, and the program carries on.

    elastic-run --standalone --nproc-per-node 2 examples/rpc_timeout.py
"""

import time

import torch.distributed.rpc as rpc

import elastic


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@elastic.record
def main() -> None:
    env = elastic.WorkerEnv.from_environ()
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=5.0)  # seconds, a float (torch's default: 60)
    rpc.init_rpc(f"worker{env.rank}", rank=env.rank, world_size=env.world_size, rpc_backend_options=options)
    if env.rank == 0:
        assert rpc.rpc_sync("worker1", slow, args=(0.1,)) == "done"  # within the default 5 s
        try:
            rpc.rpc_sync("worker1", slow, args=(3.0,), timeout=0.5)  # per-call timeout, seconds
        except RuntimeError as exc:
            if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                raise
            print(f"rank 0: slow call timed out as asked: {str(exc).splitlines()[0]}", flush=True)
        else:
            raise RuntimeError("the slow call did not time out")
        print("rank 0: carried on after the timeout", flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    main()
