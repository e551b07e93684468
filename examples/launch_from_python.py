"""Launching workers from Python with torch's API shape: a function (its per-rank return values come
back) and a command. Run it with ``python examples/launch_from_python.py``: no etcd endpoint, one
node, so a local etcd is started for each launch, as ``elastic-run --standalone`` does."""

import os
import sys

from elastic.launch import LaunchConfig, elastic_launch


def train(lr):  # module level, as for torch's spawn (a notebook's cell is fine)
    return f"rank {os.environ['RANK']} trained with lr={lr}"


if __name__ == "__main__":
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts=1)
    print(elastic_launch(config, train)(0.1))
    # a command; one write per line, since both ranks share the console
    print(elastic_launch(config, sys.executable)("-c", "import sys; sys.stdout.write('hello\\n')"))
