"""The rendezvous at 1k-10k nodes: what a round, a loss and a late join cost etcd, and what a big
job costs it each second while it trains. etcd's own CPU, requests, bytes and events are measured;
the participants are real handlers (``RendezvousHandler``, this checkout's code, unchanged).

    python bench/scale.py [--sizes 1024,2048,4096,8192,10000] [--procs 4] [--rack 256] [--steady 10]
                          [--ttl 15] [--no-late] [--steady-only [--renew-every S]] [--json FILE]

etcd runs pinned to CPU 0 (``GOMAXPROCS=1``, etcd's default raft timing) and the participants on
the other CPUs (``taskset``), so the harness does not take etcd's core. Participants are cheap: the
ones of a process share one client (one gRPC channel: their lease keep-alives and watches are
streams on it, as they would be on an agent's own channel), one thread each. Per K, one job of K
nodes (``max_nodes`` = K) goes through:

- ``first``: every node joins; the round freezes as the last one arrives (max_nodes);
- ``steady``: the job runs for ``--steady`` s, every node following its round (an agent's monitor):
  what etcd spends each second (lease renewals, watch progress), per node;
- ``leave``: one node's process is SIGKILLed and its lease revoked (as an agent's reaper does):
  until every survivor holds its place in the next round;
- ``rack``: a process of ``--rack`` nodes is SIGKILLed (a rack lost); their leases expire together
  after the TTL (etcd revokes expired leases at a bounded rate): from the first expiry until every
  survivor holds its place;

then a second job of K nodes: 90 % form a round (``min_nodes``, after a 1 s last call) and then:

- ``late``: the last 10 % join: from their start until all K hold their places in the next round.

Per phase it prints seconds, etcd CPU seconds, and per node KB sent, KB received, mvcc events,
requests (unary calls and stream messages received); ``x`` is the growth from the K before.
``--json FILE`` writes every figure, the requests by gRPC method too (``bench/scale_plot.py`` draws
them). Thousands of handlers' threads on one core is the harness's limit: ``--ttl 60`` keeps a
participant whose renewals wait for the GIL from losing its lease (renewals still as often as a
15 s lease's). ``--steady-only``: the training job's steady state alone, its nodes as their leases
and round watches (``scale_load.quiet_participants``), light enough for 10,000 nodes and more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import scale_load  # noqa: E402
from bench.etcdside import ETCD_CPU, etcd_figures, pinned_etcd, spent  # noqa: E402
from bench.scale_load import TIMEOUT, VERBOSE, Job, _count_request, _lease, _nodes, quiet_participants  # noqa: E402
from bench.scale_thin import thin_participants  # noqa: E402
from rendezvous import EtcdClient  # noqa: E402
from rendezvous.etcd.watch import EventType, KeyRange, Watch  # noqa: E402
from rendezvous.job.keys import JobKeys  # noqa: E402
from rendezvous.settings import RendezvousSettings  # noqa: E402


def _placed(job: Job, endpoint: str, count: int, round_: int, since: float, before: dict) -> tuple[dict, dict]:
    cpu = job.cpu()
    try:
        placed = job.collect("placed", count, round_)
    except RuntimeError:
        if VERBOSE:  # what etcd was asked meanwhile, a node
            took = spent(before, etcd_figures(endpoint), count, time.time() - since)
            print(f"  round {round_} not formed: {took}", file=sys.stderr, flush=True)
        raise
    ranks = sorted(rank for _, rank, _ in placed.values())
    if ranks != list(range(count)):
        wrong = sorted(set(range(count)).symmetric_difference(ranks))[:10]
        raise RuntimeError(f"round {round_}: the ranks are not 0..{count - 1}: {len(ranks)} ranks, {wrong} differ")
    seconds = max(at for _, _, at in placed.values()) - since
    phase = spent(before, etcd_figures(endpoint), count, seconds)
    phase["clients_cpu"] = job.cpu() - cpu
    return phase, placed


_KIND = {False: "", True: "-thin"}  # a run id of each kind: --thin-check runs both on one etcd


def _job(server, groups: dict[str, list[str]], settings, cpus: set[int], thin: bool) -> tuple[Job, str]:
    """The job's participants, and the group that starts first (its coordinator among them). ``thin``
    (``--thin``): the first group's first node is a real handler of its own ("coord"), the rest thin."""
    if not thin:
        return Job(server.endpoints, groups, settings, cpus), next(iter(groups))
    first, *others = groups
    thin = {"coord": [groups[first][0]], first: groups[first][1:], **{name: groups[name] for name in others}}
    targets = {name: thin_participants for name in thin if name != "coord"}
    return Job(server.endpoints, thin, settings, cpus, target=targets), "coord"


def _start(job: Job, first: str, client: EtcdClient, keys: JobKeys, then) -> None:
    """The first group, then (once a node claimed the coordinator's key) the groups ``then``."""
    job.go[first].set()
    _after_the_claim(client, keys)
    for name in then:
        job.go[name].set()


def first_job(server, k: int, rack: int, steady: float, cpus: set[int], thin: bool) -> dict:
    """The first round, the steady state, one node leaving, a rack lost."""
    endpoint = server.endpoints.split(",")[0]
    settings = RendezvousSettings(
        run_id=f"scale-{k}{_KIND[thin]}", min_nodes=max(k // 2, 1), max_nodes=k, join_timeout=TIMEOUT, **_lease(k)
    )
    groups = {"rest": _nodes("n", k - rack - 1), "rack": _nodes("r", rack), "leaver": ["leaver"]}
    job, first = _job(server, groups, settings, cpus, thin)
    client, keys = EtcdClient(server.endpoints, timeout=60), JobKeys(settings.key_prefix, settings.run_id)
    phases: dict[str, dict] = {}
    try:
        before, t0 = etcd_figures(endpoint), time.time()
        _start(job, first, client, keys, job.go)  # the rack and the leaver do not coordinate: they are lost
        phases["first"], _ = _placed(job, endpoint, k, 1, t0, before)
        time.sleep(2.0)  # every node follows its round
        phases["steady"] = _per_second(job, endpoint, k, steady)
        before, t0 = etcd_figures(endpoint), time.time()
        lease = client.get(keys.node("leaver")).lease
        os.kill(job.procs["leaver"][0].pid, signal.SIGKILL)  # its agent gone, and its reaper revokes its lease
        client.revoke_lease(lease)
        phases["leave"], _ = _placed(job, endpoint, k - 1, 2, t0, before)
        phases["rack"] = _lose_rack(job, server, settings, k - 1 - rack)
    finally:
        job.close()
        client.close()
    return phases


def _after_the_claim(client: EtcdClient, keys: JobKeys) -> None:
    """Once a node claimed the coordinator's key (polled every 20 ms)."""
    deadline = time.time() + TIMEOUT
    while client.get(keys.coordinator) is None:
        if time.time() > deadline:
            raise RuntimeError("nobody claimed the coordinator's key")
        time.sleep(0.02)


def _lose_rack(job: Job, server, settings, survivors: int) -> dict:
    endpoint = server.endpoints.split(",")[0]
    client = EtcdClient(server.endpoints, timeout=30)
    keys = JobKeys(settings.key_prefix, settings.run_id)
    revision = client.range(_count_request(keys.nodes)).header.revision
    gone = Watch(client, KeyRange(keys.nodes, prefix=True, deletes_only=True), start_revision=revision + 1)
    try:
        killed = time.time()
        for proc in job.procs["rack"]:
            os.kill(proc.pid, signal.SIGKILL)
        first = gone.get(settings.lease_ttl + 30)
        if first is None or first.type is not EventType.DELETE:
            raise RuntimeError("the rack's leases did not expire")
        expired, before = time.time(), etcd_figures(endpoint)
        phase, _ = _placed(job, endpoint, survivors, 3, expired, before)
        phase["from_kill"] = phase["seconds"] + (expired - killed)
        return phase
    finally:
        gone.close()
        client.close()


def steady_job(server, k: int, steady: float, cpus: set[int], renew_every: float | None = None) -> dict:
    """What K quiet nodes cost etcd each second (leases at the default TTL, renewed as K says, or
    every ``renew_every`` s)."""
    endpoint = server.endpoints.split(",")[0]
    settings = RendezvousSettings(run_id=f"steady-{k}", min_nodes=1, max_nodes=k, keep_alive_interval=renew_every)
    job = Job(server.endpoints, {"quiet": _nodes("q", k)}, settings, cpus, target=quiet_participants)
    try:
        time.sleep(2 * settings.renew_every + 1.0)  # every lease renewed twice since the last grant
        return _per_second(job, endpoint, k, steady)
    finally:
        job.close()


def _per_second(job: Job, endpoint: str, k: int, steady: float) -> dict:
    """etcd's figures per node and second over ``steady`` seconds, and its and the load's CPU a second."""
    before, c0, t0 = etcd_figures(endpoint), job.cpu(), time.time()
    time.sleep(steady)
    phase, seconds = spent(before, etcd_figures(endpoint), k, 1.0), time.time() - t0
    for key in ("etcd_cpu", "kb_sent", "kb_received", "events", "requests"):
        phase[key] /= seconds
    phase["methods"] = {m: round(v / seconds, 3) for m, v in phase["methods"].items()}
    phase["clients_cpu"] = (job.cpu() - c0) / seconds
    return phase


def late_job(server, k: int, cpus: set[int], thin: bool) -> dict:
    """90 % of K form a round; then the last 10 % join: until all K hold their places."""
    endpoint = server.endpoints.split(",")[0]
    early = k - k // 10
    settings = RendezvousSettings(
        run_id=f"late-{k}{_KIND[thin]}",
        min_nodes=early,
        max_nodes=k,
        join_timeout=TIMEOUT,
        last_call_timeout=1.0,
        **_lease(k),
    )
    job, first = _job(server, {"early": _nodes("e", early), "late": _nodes("l", k // 10)}, settings, cpus, thin)
    client, keys = EtcdClient(server.endpoints, timeout=60), JobKeys(settings.key_prefix, settings.run_id)
    try:
        _start(job, first, client, keys, ["early"])
        job.collect("placed", early, 1)
        time.sleep(2.0)
        before, t0 = etcd_figures(endpoint), time.time()
        job.go["late"].set()
        phase, _ = _placed(job, endpoint, k, 2, t0, before)
        return phase
    finally:
        job.close()
        client.close()


# -- the table ------------------------------------------------------------------------------------------
PHASES = ("first", "leave", "rack", "late")
HEAD = (
    f"{'K':>6} {'phase':>6} {'s':>7} {'x':>4} {'etcd cpu s':>10} {'x':>4} {'KB out':>7} {'KB in':>6} "
    f"{'events':>6} {'reqs':>6} {'etcd%':>5} {'them%':>5}"
)


def _growth(now: float, before: float | None) -> str:
    return f"{now / before:4.1f}" if before else "   -"


def row(k: int, name: str, phase: dict, before: dict | None) -> str:
    """One phase's line; figures per node (the steady state's: per node and second)."""
    b = before or {}
    return (
        f"{k:>6} {name:>6} {phase['seconds']:7.2f} {_growth(phase['seconds'], b.get('seconds'))} "
        f"{phase['etcd_cpu']:10.3f} {_growth(phase['etcd_cpu'], b.get('etcd_cpu'))} {phase['kb_sent']:7.2f} "
        f"{phase['kb_received']:6.2f} {phase['events']:6.2f} {phase['requests']:6.2f} "
        f"{phase['etcd_cpu'] / phase['seconds'] * 100:5.0f} "
        f"{phase.get('clients_cpu', 0.0) / phase['seconds'] * 100:5.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096,8192,10000")
    parser.add_argument("--procs", type=int, default=scale_load.PROCS, help="processes of participants per job")
    parser.add_argument("--rack", type=int, default=256, help="nodes of the rack lost at once")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds the steady state is measured")
    parser.add_argument("--no-late", action="store_true", help="skip the late-join job")
    parser.add_argument("--json", default="", help="write every figure to this file (after each K)")
    parser.add_argument(
        "--steady-only",
        action="store_true",
        help="only the steady state, of nodes as leases and watches (light: to 10,000 nodes and more)",
    )
    parser.add_argument("--renew-every", type=float, default=None, help="with --steady-only: renewals this often")
    parser.add_argument("--torch-sizes", default="", help="K values to run torch's etcd-v2 handler at, e.g. 8,64")
    parser.add_argument(
        "--ttl",
        type=int,
        default=15,
        help="the leases' TTL (default 15, the project's): longer keeps participants the harness's core starves "
        "from losing their leases (thousands of Python threads on one core: their renewals can wait for the GIL)",
    )
    parser.add_argument(
        "--thin-check",
        action="store_true",
        help="at each K, the real handlers and then the thin ones: their requests to etcd side by side",
    )
    parser.add_argument(
        "--thin",
        action="store_true",
        help="participants as coroutines (bench/scale_thin.py; the coordinator a real handler): 8k-16k nodes",
    )
    args = parser.parse_args()
    scale_load.PROCS, scale_load.TTL = args.procs, args.ttl
    cpus = set(range(os.cpu_count() or 1)) - {ETCD_CPU} or {ETCD_CPU}
    print(f"etcd on CPU {ETCD_CPU}, participants on CPU {','.join(map(str, sorted(cpus)))}", flush=True)
    print(HEAD, flush=True)
    results: dict[int, dict] = {}
    with pinned_etcd("--enable-v2") as server:
        last: dict[str, dict] = {}
        for k in (int(s) for s in args.sizes.split(",")):
            try:
                phases = _one_size(server, k, args, cpus)
            except RuntimeError as exc:
                print(f"{k:>6} failed: {exc}", flush=True)
                last = {}
                continue
            results[k] = phases
            for name in PHASES:
                if name in phases:
                    print(row(k, name, phases[name], last.get(name)), flush=True)
            for name in ("steady", "quiet"):
                if name in phases:
                    print(steady_line(k, name, phases[name]), flush=True)
            last = phases
            if args.json:  # after each K: a run cut short keeps what it measured
                with open(args.json, "w") as handle:
                    json.dump({str(k): v for k, v in results.items()}, handle, indent=1, sort_keys=True)
        for k in (int(s) for s in args.torch_sizes.split(",") if s):
            took = torchs(server, k)
            said = f"{took:.2f} s" if took is not None else "not run (torch or python-etcd missing, or timed out)"
            print(f"torch's DynamicRendezvousHandler on etcd-v2, K={k}: the first round in {said}", flush=True)


def _one_size(server, k: int, args, cpus: set[int]) -> dict:
    if args.thin_check:  # the real handlers, then the thin ones, at the same K on the same etcd
        real = _phases(server, k, args, cpus, thin=False)
        thin = _phases(server, k, args, cpus, thin=True)
        for line in check_lines(k, real, thin):
            print(line, flush=True)
        return {**thin, "real": real}
    return _phases(server, k, args, cpus, thin=args.thin)


def _phases(server, k: int, args, cpus: set[int], thin: bool) -> dict:
    if args.steady_only:
        return {"quiet": steady_job(server, k, args.steady, cpus, args.renew_every)}
    phases = first_job(server, k, min(args.rack, k // 4), args.steady, cpus, thin)
    if not args.no_late:
        phases["late"] = late_job(server, k, cpus, thin)
    return phases


def check_lines(k: int, real: dict, thin: dict) -> list[str]:
    """Per phase, thin / real: etcd's CPU, bytes and events, and each gRPC method's requests, a node."""
    lines = [f"{k:>6} thin / real, a node (etcd CPU s in all):"]
    for name in (*PHASES, "steady"):
        if name in real and name in thin:
            a, b = thin[name], real[name]
            methods = sorted(set(a["methods"]) | set(b["methods"]))
            said = ", ".join(f"{m} {a['methods'].get(m, 0):.3f}/{b['methods'].get(m, 0):.3f}" for m in methods)
            lines.append(
                f"{'':>6} {name:>6}: s {a['seconds']:.2f}/{b['seconds']:.2f}, etcd CPU {a['etcd_cpu']:.3f}/"
                f"{b['etcd_cpu']:.3f}, KB out {a['kb_sent']:.2f}/{b['kb_sent']:.2f}, KB in {a['kb_received']:.2f}/"
                f"{b['kb_received']:.2f}, events {a['events']:.2f}/{b['events']:.2f}; {said}"
            )
    return lines


def steady_line(k: int, name: str, steady: dict) -> str:
    """What a job of ``k`` nodes costs etcd a second while it trains (``quiet``: as leases and watches)."""
    return (
        f"{k:>6} {name}: etcd {steady['etcd_cpu']:.3f} CPU s a second ({steady['etcd_cpu'] * 1e6 / k:.1f} us a node), "
        f"{steady['requests'] * k:.0f} requests/s ({steady['requests']:.2f} a node: {steady['methods']}), "
        f"{steady['kb_sent'] * k:.0f} KB/s out; the participants {steady['clients_cpu']:.2f} CPU s a second"
    )


def torchs(server, k: int) -> float | None:
    """torch's DynamicRendezvousHandler on its etcd-v2 backend (this etcd with ``--enable-v2``), K threads."""
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
    host, port = server.endpoints.split(",")[0].split(":")
    handlers = []
    for _ in range(k):
        client = etcd.Client(host=host, port=int(port), read_timeout=60)
        backend = EtcdRendezvousBackend(client, f"scale-{k}", key_prefix="/torch", ttl=600)
        timeout = RendezvousTimeout(join=timedelta(seconds=TIMEOUT))
        handlers.append(
            DynamicRendezvousHandler.from_backend(
                f"torch-{k}", EtcdStore(client, "/torch-store"), backend, k, k, local_addr="127.0.0.1", timeout=timeout
            )
        )
    threads = [threading.Thread(target=h.next_rendezvous, daemon=True) for h in handlers]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    return None if any(t.is_alive() for t in threads) else time.perf_counter() - started


if __name__ == "__main__":
    main()
