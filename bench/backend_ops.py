"""Backend round trips per second against raw etcd get/put on the same server, side by side.

    python bench/backend_ops.py [--ops 2000] [--rounds 5]

Raw = python3-etcd3's own client doing a plain get / put of the same key size. The backend's
get_state is one range read plus header validation; set_state is one guarded transaction.
Rounds alternate between the two so machine noise hits both alike; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import etcd3  # noqa: E402

from rendezvous import EtcdClient, EtcdRendezvousBackend, EtcdServer  # noqa: E402


def _rate(fn, ops: int) -> float:
    started = time.perf_counter()
    for _ in range(ops):
        fn()
    return ops / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    payload = b"x" * 512
    with EtcdServer() as server:
        host, port = server.endpoints.split(":")
        raw = etcd3.client(host=host, port=int(port), timeout=5)
        client = EtcdClient(server.endpoints, timeout=5)
        backend = EtcdRendezvousBackend(client, "bench")
        raw.put("/bench/raw", payload)
        token = [backend.set_state(payload)[1]]

        def cas_write():
            token[0] = backend.set_state(payload, token[0])[1]

        results = {name: [] for name in ("raw get", "get_state", "raw put", "set_state")}
        for _ in range(args.rounds):
            results["raw get"].append(_rate(lambda: raw.get("/bench/raw"), args.ops))
            results["get_state"].append(_rate(backend.get_state, args.ops))
            results["raw put"].append(_rate(lambda: raw.put("/bench/raw", payload), args.ops))
            results["set_state"].append(_rate(cas_write, args.ops))
        raw.close()
        client.close()
    median = {name: statistics.median(values) for name, values in results.items()}
    print(f"{'operation':<12} {'ops/s (median of ' + str(args.rounds) + ')':>24}")
    for name, value in median.items():
        print(f"{name:<12} {value:>24.0f}")
    print(f"get_state costs {median['raw get'] / median['get_state']:.2f}x a raw get (target <= 1.3x)")
    print(f"set_state costs {median['raw put'] / median['set_state']:.2f}x a raw put (target <= 1.3x)")


if __name__ == "__main__":
    main()
