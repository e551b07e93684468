"""A tutorial-shaped gloo worker whose second node goes away before its ranks join the group.

``PEER_GONE=exit``: the ranks of group rank 1 exit 3 at once (with ``--max-restarts 0`` their
agent gives up and closes the rendezvous); ``PEER_GONE=hang``: they touch ``<dir>/hung-<pid>`` and
sleep (the test SIGKILLs their node). Every other rank joins the default group -- waiting there for
the missing ranks -- and, once a group forms, all-reduces, tears down and touches ``<dir>/done-<world>``.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    marks = Path(sys.argv[1])
    if os.environ["GROUP_RANK"] == "1":
        if os.environ["PEER_GONE"] == "exit":
            sys.exit(3)
        (marks / f"hung-{os.getpid()}").touch()
        time.sleep(600)
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    assert int(total.item()) == dist.get_world_size()
    dist.destroy_process_group()
    (marks / f"done-{os.environ['WORLD_SIZE']}").touch()


if __name__ == "__main__":
    main()
