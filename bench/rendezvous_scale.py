"""K participants form one round, then lose one node and re-rank: what it costs etcd and each node.

    python bench/rendezvous_scale.py [--sizes 256,512,1024,2048,4096] [--procs 8] [--torch-sizes 8,64]

Each participant is its own client, lease and handler, as separate agents would be, spread over
``--procs`` processes (threads within each), with the cyclic GC on and default settings. Per K it
prints:

- ``round s``: start to the last participant's return from its first round (max_nodes = K, so the
  round freezes as the last one joins);
- ``etcd cpu s``: etcd's CPU for that round (``process_cpu_seconds_total``);
- ``KB/node``, ``events/node``: what etcd sent to clients during the round, per participant
  (``etcd_network_client_grpc_sent_bytes_total``, ``etcd_debugging_mvcc_events_total``);
- ``clients cpu s``: the participants' processes' CPU for the round;
- ``loss s``: after every participant follows its running round (the monitor an agent keeps), one
  participant leaves (its lease revoked, as an agent's reaper does): seconds until every survivor
  returned from the next round; then ``etcd cpu`` and ``KB/node`` for that re-rendezvous;
- ``x``: growth of round time and etcd CPU from the K before (target: <= 2.3 per doubling);
- ``rss MB``: a process holding one more participant (a handler following the round), its RSS.

``--torch-sizes``: torch's DynamicRendezvousHandler on its etcd-v2 backend (etcd run with
``--enable-v2``), K threads in this process, side by side: round seconds only.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import multiprocessing as mp
import os
import sys
import threading
import time
import urllib.request
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

from rendezvous import EtcdClient, EtcdServer  # noqa: E402
from rendezvous.rounds.handler import RendezvousHandler  # noqa: E402
from rendezvous.settings import RendezvousSettings  # noqa: E402

TIMEOUT = 120.0
METRICS = ("process_cpu_seconds_total", "etcd_network_client_grpc_sent_bytes_total", "etcd_debugging_mvcc_events_total")


def etcd_metrics(endpoint: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            out[name] = float(value)
    return out


def _probe(endpoint: str) -> dict:
    """The handler's probe endpoint, where the checkout's handler takes one (an older one does not)."""
    return {"probe": endpoint} if "probe" in inspect.signature(RendezvousHandler).parameters else {}


def _participant(handler, go, results, leave, stop, rss: bool = False) -> None:
    """One agent's rendezvous life: a round, following it, and (unless it is the one to leave) the next."""
    try:
        go.wait()
        info = handler.next_rendezvous()
        results.put(("round", handler.node_id, info.group_rank, time.time()))
        handler.membership_changed(0)  # the running round's monitor, as an agent sets it up
        results.put(("following", handler.node_id, 0, time.time()))
        if rss:
            results.put(("rss", handler.node_id, psutil.Process().memory_info().rss, time.time()))
        if handler.node_id == "n00000" and _wait(leave, stop):
            handler.shutdown()
            return
        while not stop.is_set():
            if handler.membership_changed(timeout=0.5):
                info = handler.next_rendezvous()
                results.put(("rerank", handler.node_id, info.group_rank, time.time()))
                break
    except Exception as exc:  # noqa: BLE001 -- reported to the parent
        results.put(("error", handler.node_id, -1, f"{type(exc).__name__}: {exc}"))


def _wait(leave, stop) -> bool:
    while not stop.is_set():
        if leave.wait(0.2):
            return True
    return False


def child(endpoints: str, run_id: str, k: int, nodes: list[int], go, results, leave, stop) -> None:
    """Participants ``nodes``, each a thread; a child of one participant also reports its RSS."""
    settings = RendezvousSettings(run_id=run_id, min_nodes=max(k // 2, 1), max_nodes=k, join_timeout=TIMEOUT)
    clients, threads = [], []
    for i in nodes:
        client = EtcdClient(endpoints, timeout=60)
        # each names a probe endpoint, as agents do: the rank table carries every node's watch list
        handler = RendezvousHandler(
            client, settings, local_addr="127.0.0.1", node_id=f"n{i:05d}", **_probe(f"127.0.0.1:{20000 + i % 40000}")
        )
        clients.append((client, handler))
        threads.append(
            threading.Thread(
                target=_participant, args=(handler, go, results, leave, stop, len(nodes) == 1), daemon=True
            )
        )
    for thread in threads:
        thread.start()
    results.put(("ready", "", len(nodes), time.time()))
    stop.wait(TIMEOUT * 3)
    for thread in threads:
        thread.join(5)
    for client, handler in clients:
        try:
            handler.shutdown()
        except Exception:  # noqa: BLE001
            pass
        client.close()


_stash: list[tuple] = []  # messages read while collecting another kind


def _collect(results, kind: str, count: int, deadline: float) -> dict[str, tuple[int, float]]:
    got: dict[str, tuple[int, float]] = {}
    for message in [m for m in _stash if m[0] == kind]:
        _stash.remove(message)
        got[message[1]] = (message[2], message[3])
    while len(got) < count:
        left = deadline - time.time()
        if left <= 0:
            raise RuntimeError(f"{kind}: {len(got)} of {count} within the bound")
        try:
            what, node, rank, at = results.get(timeout=left)
        except Exception:  # noqa: BLE001 -- queue.Empty
            continue
        if what == "error":
            raise RuntimeError(f"{node}: {at}")
        if what == kind:
            got[node] = (rank, at)
        else:
            _stash.append((what, node, rank, at))
    return got


def one_size(server, k: int, procs: int, run: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    go, leave, stop = ctx.Event(), ctx.Event(), ctx.Event()
    results = ctx.Queue()
    _stash.clear()
    run_id = f"scale-{k}-{run}"
    endpoint = server.endpoints.split(",")[0]
    shares = [list(range(p, k - 1, procs)) for p in range(procs)]
    children = [
        ctx.Process(target=child, args=(server.endpoints, run_id, k, share, go, results, leave, stop))
        for share in shares
        if share
    ]
    children.append(ctx.Process(target=child, args=(server.endpoints, run_id, k, [k - 1], go, results, leave, stop)))
    for proc in children:
        proc.start()
    try:
        _collect_ready(results, len(children))
        cpu = lambda: sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in children)  # noqa: E731
        m0, c0, t0 = etcd_metrics(endpoint), cpu(), time.time()
        go.set()
        firsts = _collect(results, "round", k, t0 + TIMEOUT)
        round_s = max(at for _, at in firsts.values()) - t0
        m1, c1 = etcd_metrics(endpoint), cpu()
        rss = _collect(results, "rss", 1, time.time() + TIMEOUT)
        ranks = sorted(r for r, _ in firsts.values())
        if ranks != list(range(k)):
            raise RuntimeError("ranks are not unique")
        _collect(results, "following", k, time.time() + TIMEOUT)
        time.sleep(1.0)
        m2, t2 = etcd_metrics(endpoint), time.time()
        leave.set()
        reranked = _collect(results, "rerank", k - 1, t2 + TIMEOUT)
        loss_s = max(at for _, at in reranked.values()) - t2
        m3 = etcd_metrics(endpoint)
        new_ranks = sorted(r for r, _ in reranked.values())
        if new_ranks != list(range(k - 1)):
            raise RuntimeError(f"after the loss the ranks are not 0..{k - 2}")
        return {
            "round": round_s,
            "etcd_cpu": _delta(m0, m1, 0),
            "kb": _delta(m0, m1, 1) / k / 1024,
            "events": _delta(m0, m1, 2) / k,
            "clients_cpu": c1 - c0,
            "loss": loss_s,
            "loss_cpu": _delta(m2, m3, 0),
            "loss_kb": _delta(m2, m3, 1) / k / 1024,
            "rss": next(iter(rss.values()))[0] / 2**20,
        }
    finally:
        stop.set()
        for proc in children:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def _collect_ready(results, count: int) -> None:
    deadline, ready = time.time() + TIMEOUT, 0
    while ready < count:
        what, node, _, at = results.get(timeout=max(deadline - time.time(), 0.1))
        if what == "error":
            raise RuntimeError(f"{node}: {at}")
        ready += what == "ready"


def _delta(before: dict, after: dict, index: int) -> float:
    name = METRICS[index]
    return after.get(name, 0.0) - before.get(name, 0.0)


def torchs(endpoints: str, k: int) -> float | None:
    try:
        import etcd  # python-etcd, the v2 client torch's backend uses
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend
        from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore
    except ImportError:
        return None
    host, port = endpoints.split(":")
    handlers = []
    for _ in range(k):
        client = etcd.Client(host=host, port=int(port), read_timeout=60)
        backend = EtcdRendezvousBackend(client, f"scale-{k}", key_prefix="/torch", ttl=600)
        store = EtcdStore(client, "/torch-store")
        handlers.append(
            DynamicRendezvousHandler.from_backend(
                f"scale-{k}",
                store,
                backend,
                k,
                k,
                local_addr="127.0.0.1",
                timeout=RendezvousTimeout(join=timedelta(seconds=TIMEOUT)),
            )
        )
    threads = [threading.Thread(target=h.next_rendezvous, daemon=True) for h in handlers]
    gc.collect()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    return None if any(t.is_alive() for t in threads) else time.perf_counter() - started


def _growth(now: float, before: float | None) -> str:
    return f"{now / before:4.1f}" if before else "   -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048,4096")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--torch-sizes", default="", help="K values to run torch's handler at (threads), e.g. 8,64")
    args = parser.parse_args()
    print(
        f"{'K':>5} {'round s':>8} {'x':>4} {'etcd cpu s':>10} {'x':>4} {'KB/node':>8} {'events/node':>11} "
        f"{'clients cpu s':>13} {'loss s':>7} {'etcd cpu':>8} {'KB/node':>8} {'rss MB':>7}",
        flush=True,
    )
    with EtcdServer(extra_args=["--enable-v2"]) as server:
        before: dict[str, float] | None = None
        for run, k in enumerate(int(s) for s in args.sizes.split(",")):
            try:
                r = one_size(server, k, args.procs, run)
            except RuntimeError as exc:
                print(f"{k:>5} failed: {exc}", flush=True)
                before = None
                continue
            prev_round = before["round"] if before else None
            prev_cpu = before["etcd_cpu"] if before else None
            print(
                f"{k:>5} {r['round']:8.2f} {_growth(r['round'], prev_round)} {r['etcd_cpu']:10.2f} "
                f"{_growth(r['etcd_cpu'], prev_cpu)} {r['kb']:8.2f} {r['events']:11.1f} {r['clients_cpu']:13.1f} "
                f"{r['loss']:7.2f} {r['loss_cpu']:8.2f} {r['loss_kb']:8.2f} {r['rss']:7.1f}",
                flush=True,
            )
            before = r
        for k in (int(s) for s in args.torch_sizes.split(",") if s):
            t = torchs(server.endpoints, k)
            print(
                f"torch etcd-v2, K={k}: "
                + (f"{t:.2f} s" if t is not None else "not run (torch or python-etcd missing, or timed out)"),
                flush=True,
            )


if __name__ == "__main__":
    main()
