"""K participants complete one rendezvous round: seconds per K, ours and (if installed) torch's.

    python bench/rendezvous_scale.py [--sizes 8,64,256,1024]

Each participant is a thread with its own etcd client and lease, as separate agents would be.
When torch and python-etcd are installed, the same harness runs torch's DynamicRendezvousHandler
on its etcd-v2 backend (etcd started with --enable-v2) side by side.

One process holding K participants holds K copies of a round of K participants: K*K objects that
Python's cyclic garbage collector scans again and again, a cost that K separate agents (K objects
each) never pay. The main columns therefore time the round with the cyclic collector paused
(reference counting still frees everything), for both systems alike; the "GC on" column times the
same round with it running. Leases have a 10 s TTL renewed every 3 s here, and a quiet watch asks
etcd for progress every 3 s rather than every second: K keep-alives and K progress probes a second
in one process would otherwise time the harness's loop, not the round (K separate agents pay one
each).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rendezvous import EtcdClient, EtcdServer  # noqa: E402
from rendezvous.handler import RendezvousHandler  # noqa: E402
from rendezvous.settings import RendezvousSettings  # noqa: E402
from rendezvous.watch import Watch  # noqa: E402

TIMEOUT = 120.0
_runs = itertools.count()


def _run_threads(targets, keep_gc: bool = False) -> float:
    errors = []

    def guard(fn):
        try:
            fn()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(t,), daemon=True) for t in targets]
    gc.collect()
    if not keep_gc:
        gc.disable()
    try:
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"round failed: {errors[:1] or 'timed out'}")
    return elapsed


def ours(endpoints: str, k: int, keep_gc: bool = False) -> float:
    settings = RendezvousSettings(run_id=f"scale-{k}-{next(_runs)}", min_nodes=k, max_nodes=k, join_timeout=TIMEOUT, lease_ttl=10,
                                  keep_alive_interval=3.0)
    Watch.PROBE_EVERY, Watch.SILENCE = 3.0, 9.0  # see the module docstring
    clients = [EtcdClient(endpoints, timeout=60) for _ in range(k)]
    handlers = [RendezvousHandler(c, settings, local_addr="127.0.0.1", node_id=f"n{i:05d}") for i, c in enumerate(clients)]
    try:
        return _run_threads([h.next_rendezvous for h in handlers], keep_gc)
    finally:
        for handler in handlers:
            handler.shutdown()
        for client in clients:
            client.close()


def torchs(endpoints: str, k: int) -> float | None:
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler, RendezvousTimeout,
        )
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend
        from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore
        import etcd  # python-etcd, the v2 client torch's backend uses
    except ImportError:
        return None
    host, port = endpoints.split(":")
    handlers = []
    for i in range(k):
        client = etcd.Client(host=host, port=int(port), read_timeout=60)
        backend = EtcdRendezvousBackend(client, f"scale-{k}", key_prefix="/torch", ttl=600)
        store = EtcdStore(client, "/torch-store")
        handlers.append(DynamicRendezvousHandler.from_backend(
            f"scale-{k}", store, backend, k, k, local_addr="127.0.0.1",
            timeout=RendezvousTimeout(join=timedelta(seconds=TIMEOUT)),
        ))
    return _run_threads([h.next_rendezvous for h in handlers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256,1024")
    parser.add_argument("--torch-max", type=int, default=256, help="largest K to run torch's handler at")
    args = parser.parse_args()
    sizes = [int(k) for k in args.sizes.split(",")]
    print(f"{'K':>6} {'etcd-elastic s':>15} {'GC on s':>8} {'torch etcd-v2 s':>16} {'ratio':>7}")
    with EtcdServer(extra_args=["--enable-v2"]) as server:
        for k in sizes:
            mine = ours(server.endpoints, k)
            mine_gc = ours(server.endpoints, k, keep_gc=True)
            theirs = torchs(server.endpoints, k) if k <= args.torch_max else None
            shown = f"{theirs:16.2f}" if theirs is not None else f"{'n/a':>16}"
            ratio = f"{theirs / mine:6.1f}x" if theirs is not None else f"{'':>7}"
            print(f"{k:>6} {mine:15.2f} {mine_gc:8.2f} {shown} {ratio}", flush=True)


if __name__ == "__main__":
    main()
