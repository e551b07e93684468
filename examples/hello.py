"""The smallest worker: print where this process stands in the job.

elastic-run --standalone --nproc-per-node 2 examples/hello.py
"""

import elastic


@elastic.record
def main() -> None:
    env = elastic.WorkerEnv.from_environ()
    print(
        f"hello from rank {env.rank} of {env.world_size} (local rank {env.local_rank} of {env.local_world_size}, "
        f"node {env.group_rank} of {env.group_world_size}), master {env.master_addr}:{env.master_port}, "
        f"restart {env.restart_count}"
    )


if __name__ == "__main__":
    main()
