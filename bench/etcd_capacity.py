"""What one etcd member on one core serves: lease renewals a second, and etcd's CPU for each one,
and for the other requests a node's join makes.

    python bench/etcd_capacity.py [--leases 10000] [--streams 8] [--seconds 10] [--rates 2000,5000,10000,0]

etcd runs pinned to CPU 0, the load on the other CPUs. The load is what a big job's steady state
mostly is (``bench/scale.py``): ``LeaseKeepAlive`` renewals on long-lived streams, each of
``--leases`` leases renewed in turn. Per rate (0: as fast as the load can send, with up to 64
renewals outstanding a stream) it prints the renewals answered a second, etcd's CPU a second (of
its one core), etcd's CPU per renewal, and the saturation it implies (renewals a second at 100 %
of the core, less etcd's idle CPU, measured first). Where the load cannot saturate etcd's core,
that last figure is an extrapolation from etcd's measured cost per renewal; the line says so. Then
etcd's CPU per call of a lease grant, a put of a 200-byte value on a lease, and a read of one key,
64 calls outstanding (docs/scale.md's model reads these).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc.aio  # noqa: E402
from etcd3 import etcdrpc  # noqa: E402

from bench.etcdside import ETCD_CPU, etcd_figures, pinned_etcd  # noqa: E402
from rendezvous import EtcdClient  # noqa: E402

WINDOW = 64  # renewals outstanding on a stream, at full rate


async def _stream(channel, leases: list[int], rate: float, until: float, done: list[int]) -> None:
    """One LeaseKeepAlive stream renewing ``leases`` in turn, at ``rate`` a second (0: full speed)."""
    call = etcdrpc.LeaseStub(channel).LeaseKeepAlive()
    window = asyncio.Semaphore(WINDOW)

    async def reader() -> None:
        while True:
            answer = await call.read()
            if answer is grpc.aio.EOF:
                return
            done[0] += 1
            window.release()

    reading = asyncio.ensure_future(reader())
    start, sent = time.monotonic(), 0
    while time.monotonic() < until:
        if rate:
            ahead = start + sent / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await window.acquire()
        await call.write(etcdrpc.LeaseKeepAliveRequest(ID=leases[sent % len(leases)]))
        sent += 1
    await call.done_writing()
    await asyncio.wait_for(reading, 10)


def load(endpoint: str, leases: list[int], streams: int, rate: float, seconds: float, cpus: set[int], out) -> None:
    """A process of ``streams`` streams on one channel, at ``rate`` renewals a second in all."""
    os.sched_setaffinity(0, cpus)

    async def run() -> int:
        done = [0]
        async with grpc.aio.insecure_channel(endpoint) as channel:
            until = time.monotonic() + seconds
            shares = [leases[i::streams] for i in range(streams)]
            await asyncio.gather(*(_stream(channel, share, rate / streams, until, done) for share in shares))
        return done[0]

    out.put(asyncio.run(run()))


async def _unary(channel, op: str, count: int, leases: list[int]) -> None:
    """``count`` calls of ``op`` (grant, put, range), 64 outstanding at a time; a put goes on a lease
    of its own, as a node's key does (etcd spends ten times as much on a put to a lease many keys share)."""
    kv, lessor = etcdrpc.KVStub(channel), etcdrpc.LeaseStub(channel)
    value = b"x" * 200  # about a node record's size
    calls = {
        "grant": lambda i: lessor.LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=600)),
        "put": lambda i: kv.Put(
            etcdrpc.PutRequest(key=f"/cap/{i % 10000}".encode(), value=value, lease=leases[i % len(leases)])
        ),
        "range": lambda i: kv.Range(etcdrpc.RangeRequest(key=f"/cap/{i % 10000}".encode())),
    }
    window = asyncio.Semaphore(WINDOW)

    async def one(i: int) -> None:
        async with window:
            await calls[op](i)

    await asyncio.gather(*(one(i) for i in range(count)))


def ops(endpoint: str, op: str, count: int, leases: list[int], cpus: set[int], out) -> None:
    os.sched_setaffinity(0, cpus)

    async def run() -> None:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            await _unary(channel, op, count, leases)

    started = time.monotonic()
    asyncio.run(run())
    out.put(time.monotonic() - started)


def cost(server, op: str, count: int, leases: list[int], cpus: set[int]) -> tuple[float, float]:
    """(etcd's CPU per call of ``op``, calls a second) over ``count`` calls."""
    endpoint = server.endpoints.split(",")[0]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    before = etcd_figures(endpoint)
    worker = ctx.Process(target=ops, args=(endpoint, op, count, leases, cpus, out))
    worker.start()
    seconds = out.get(timeout=300)
    worker.join(10)
    return (etcd_figures(endpoint)["cpu"] - before["cpu"]) / count, count / seconds


def measure(server, leases: list[int], streams: int, rate: float, seconds: float, cpus: set[int]) -> dict:
    endpoint = server.endpoints.split(",")[0]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = max(1, len(cpus))
    workers = [
        ctx.Process(target=load, args=(endpoint, leases[i::procs], streams, rate / procs, seconds, cpus, out))
        for i in range(procs)
    ]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # the streams open; what follows is counted by etcd
    before, t0 = etcd_figures(endpoint), time.time()
    time.sleep(seconds - 2.0)
    after, t1 = etcd_figures(endpoint), time.time()
    answered = sum(out.get(timeout=seconds + 30) for _ in workers)
    for worker in workers:
        worker.join(10)
    renewals = after.get("msg:LeaseKeepAlive", 0.0) - before.get("msg:LeaseKeepAlive", 0.0)
    return {
        "rate": renewals / (t1 - t0),
        "cpu": (after["cpu"] - before["cpu"]) / (t1 - t0),
        "answered": answered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=10000)
    parser.add_argument("--streams", type=int, default=8, help="streams per load process")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", default="2000,5000,10000,0", help="renewals a second in all (0: full speed)")
    parser.add_argument("--calls", type=int, default=20000, help="calls of each unary request measured")
    args = parser.parse_args()
    cpus = set(range(os.cpu_count() or 1)) - {ETCD_CPU} or {ETCD_CPU}
    with pinned_etcd() as server:
        endpoint = server.endpoints.split(",")[0]
        client = EtcdClient(server.endpoints, timeout=60)
        leases = [client.grant_lease(600) for _ in range(args.leases)]
        time.sleep(2.0)
        before, t0 = etcd_figures(endpoint), time.time()
        time.sleep(5.0)
        idle = (etcd_figures(endpoint)["cpu"] - before["cpu"]) / (time.time() - t0)
        print(f"etcd on CPU {ETCD_CPU}, the load on CPU {','.join(map(str, sorted(cpus)))}; {args.leases} leases")
        print(f"idle: etcd {idle * 100:.1f} % of its core")
        print(f"{'asked/s':>8} {'renewals/s':>10} {'etcd core %':>11} {'us a renewal':>12} {'at 100 %/s':>10}")
        for rate in (float(r) for r in args.rates.split(",")):
            r = measure(server, leases, args.streams, rate, args.seconds, cpus)
            per = (r["cpu"] - idle) / r["rate"] if r["rate"] else float("nan")
            full = (1.0 - idle) / per if per > 0 else float("nan")
            note = "" if r["cpu"] > 0.9 else "  (etcd's core not full: extrapolated)"
            asked = f"{rate:8.0f}" if rate else f"{'full':>8}"
            print(f"{asked} {r['rate']:10.0f} {r['cpu'] * 100:11.1f} {per * 1e6:12.1f} {full:10.0f}{note}", flush=True)
        print("etcd's CPU per call, 64 outstanding (a node's join: a lease grant, a put on it, a few reads):")
        for op in ("grant", "put", "range"):
            per, rate = cost(server, op, args.calls, leases, cpus)
            print(f"  {op:>6}: {per * 1e6:6.1f} us of etcd CPU a call, {rate:7.0f} calls/s", flush=True)
        for lease in leases:
            client.revoke_lease(lease)
        client.close()


if __name__ == "__main__":
    main()
