"""The rendezvous at 1k-10k nodes: what a round, a loss and a late join cost etcd, and what a big
job costs it each second while it trains. etcd's own CPU, requests, bytes and events are measured;
the participants are real handlers (``RendezvousHandler``, this checkout's code, unchanged).

    python bench/scale.py [--sizes 1024,2048,4096,8192,10000] [--procs 4] [--rack 256] [--steady 10]

etcd runs pinned to CPU 0 and the participants to the other CPUs (``taskset``), so the harness does
not take etcd's core. Participants are cheap: the ones of a process share one client (one gRPC
channel: their lease keep-alives and watches are streams on it, as they would be on an agent's own
channel), one thread each. Per K, one job of K nodes (``max_nodes`` = K) goes through:

- ``first``: every node joins; the round freezes as the last one arrives (max_nodes);
- ``steady``: the job runs for ``--steady`` s, every node following its round (an agent's monitor):
  what etcd spends each second (lease renewals, watch progress), per node;
- ``leave``: one node leaves (its lease revoked, as an agent's reaper does): until every survivor
  holds its place in the next round;
- ``rack``: a process of ``--rack`` nodes is SIGKILLed (a rack lost); their leases expire together
  after the TTL (etcd revokes expired leases at a bounded rate): from the first expiry until every
  survivor holds its place;

then a second job of K nodes: 90 % form a round (``min_nodes``, after a 1 s last call) and then:

- ``late``: the last 10 % join: from their start until all K hold their places in the next round.

Per phase it prints seconds, etcd CPU seconds, and per node KB sent, KB received, mvcc events,
requests (unary calls and stream messages received); ``x`` is the growth from the K before.
``--json FILE`` writes every figure, the requests by gRPC method too (docs/scale.md's plot reads it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rendezvous import EtcdClient, EtcdServer  # noqa: E402
from rendezvous.etcd.watch import EventType, KeyRange, Watch  # noqa: E402
from rendezvous.job.keys import JobKeys  # noqa: E402
from rendezvous.rounds.handler import RendezvousHandler  # noqa: E402
from rendezvous.settings import RendezvousSettings  # noqa: E402

TIMEOUT = float(os.environ.get("SCALE_TIMEOUT", 300.0))
ETCD_CPU = 0
# etcd's own raft timing, as a deployment runs it (a lone test member ticks every 10 ms to elect itself fast)
ETCD_DEFAULTS = ("--heartbeat-interval=100", "--election-timeout=1000")
_SUMS = {
    "cpu": "process_cpu_seconds",
    "sent": "etcd_network_client_grpc_sent_bytes",
    "received": "etcd_network_client_grpc_received_bytes",
    "events": "etcd_debugging_mvcc_events",
}


# -- etcd's side: its metrics --------------------------------------------------------------------------
def etcd_figures(endpoint: str) -> dict[str, float]:
    """etcd's counters now: CPU, bytes each way, mvcc events, and requests by gRPC method (unary calls
    started; stream messages received, ``LeaseKeepAlive`` renewals among them)."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, name in _SUMS.items():
                if sample.name in (name, name + "_total"):
                    out[key] = out.get(key, 0.0) + sample.value
            method = sample.labels.get("grpc_method", "")
            if sample.name == "grpc_server_started_total" and sample.labels.get("grpc_type") == "unary":
                out[f"rpc:{method}"] = out.get(f"rpc:{method}", 0.0) + sample.value
            if sample.name == "grpc_server_msg_received_total" and sample.labels.get("grpc_type") != "unary":
                out[f"msg:{method}"] = out.get(f"msg:{method}", 0.0) + sample.value
    return out


def spent(before: dict[str, float], after: dict[str, float], nodes: int, seconds: float) -> dict:
    """What etcd spent between two readings: totals, per node, and the requests by method."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    methods = {k: v for k, v in delta.items() if k.startswith(("rpc:", "msg:")) and v}
    requests = sum(methods.values())
    return {
        "seconds": seconds,
        "etcd_cpu": delta.get("cpu", 0.0),
        "kb_sent": delta.get("sent", 0.0) / nodes / 1024,
        "kb_received": delta.get("received", 0.0) / nodes / 1024,
        "events": delta.get("events", 0.0) / nodes,
        "requests": requests / nodes,
        "methods": {k: round(v / nodes, 3) for k, v in sorted(methods.items())},
    }


def pin(pid: int, cpus: str) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    subprocess.run(["taskset", "-a", "-cp", cpus, str(pid)], check=True, capture_output=True)


# -- the participants' side ----------------------------------------------------------------------------
def _participant(handler: RendezvousHandler, go, out, stop: threading.Event) -> None:
    """One agent's rendezvous: its round, then following it, and a new round whenever it changes."""
    over = stop.is_set
    try:
        go.wait()
        while not over():
            info = handler.next_rendezvous()
            out.put(("placed", handler.node_id, info.round, info.group_rank, time.time()))
            while not over() and not handler.membership_changed(timeout=0.5):
                pass
    except Exception as exc:  # noqa: BLE001 -- reported to the parent
        if not over():
            out.put(("error", handler.node_id, 0, 0, f"{type(exc).__name__}: {exc}"))


def participants(endpoints: str, settings: RendezvousSettings, nodes: list[str], cpus: set[int], events) -> None:
    """A process of participants sharing one client: ``events`` = (go, out, stopped)."""
    os.sched_setaffinity(0, cpus)
    sys.setswitchinterval(SWITCH)  # hundreds of threads: fewer forced handoffs of the GIL (the harness's cost)
    go, out, stopped = events
    stop = threading.Event()  # set from the shared flag: a process may be SIGKILLed (no waiter on a shared lock)
    client = EtcdClient(endpoints, timeout=120)
    # each names a probe endpoint, as agents do: every row of the rank table carries its watch list
    handlers = [
        RendezvousHandler(client, settings, local_addr="127.0.0.1", node_id=n, probe=f"127.0.0.1:{20000 + i}")
        for i, n in enumerate(nodes)
    ]
    threads = [threading.Thread(target=_participant, args=(h, go, out, stop), daemon=True) for h in handlers]
    for thread in threads:
        thread.start()
    out.put(("ready", nodes[0], len(nodes), 0, time.time()))
    while not stopped.value:
        time.sleep(0.2)
    stop.set()
    for handler in handlers:
        try:
            handler.shutdown()
        except Exception:  # noqa: BLE001
            pass
    client.close()


class Job:
    """One job's participants over several processes, and what they report."""

    def __init__(self, endpoints: str, run_id: str, groups: dict[str, list[str]], settings, cpus: set[int]) -> None:
        self._ctx = mp.get_context("spawn")
        self.out = self._ctx.Queue()
        self.stop = self._ctx.RawValue("b", 0)  # flags, not Events: no lock a SIGKILLed process could hold
        self.go: dict[str, object] = {}
        self.procs: dict[str, list] = {}
        for name, nodes in groups.items():
            self.go[name] = self._ctx.Event()
            shares = [nodes[i :: self._share(name, len(nodes))] for i in range(self._share(name, len(nodes)))]
            self.procs[name] = [
                self._ctx.Process(
                    target=participants,
                    args=(endpoints, settings, share, cpus, (self.go[name], self.out, self.stop)),
                )
                for share in shares
                if share
            ]
        self._stash: list[tuple] = []
        for procs in self.procs.values():
            for proc in procs:
                proc.start()
        self.collect("ready", sum(len(p) for p in self.procs.values()))

    @staticmethod
    def _share(name: str, count: int) -> int:
        return 1 if name in ("leaver", "rack") else max(1, min(PROCS, count))

    def collect(self, kind: str, count: int, round_: int | None = None) -> dict[str, tuple]:
        """``count`` messages of ``kind`` (of round ``round_``): node -> (round, rank, at)."""
        if VERBOSE:
            print(f"  waiting for {count} {kind} (round {round_})", file=sys.stderr, flush=True)
        got: dict[str, tuple] = {}
        deadline = time.time() + TIMEOUT
        pending, self._stash = self._stash, []
        for message in pending:
            self._take(message, kind, round_, got)
        while len(got) < count:
            try:
                message = self.out.get(timeout=max(deadline - time.time(), 0.01))
            except Exception as exc:  # noqa: BLE001 -- queue.Empty
                raise RuntimeError(f"{kind}: {len(got)} of {count} within {TIMEOUT:g} s") from exc
            self._take(message, kind, round_, got)
        return got

    def _take(self, message: tuple, kind: str, round_: int | None, got: dict) -> None:
        what, node, rnd, rank, at = message
        if what == "error":
            raise RuntimeError(f"{node}: {at}")
        if what == kind and (round_ is None or rnd == round_):
            got[node] = (rnd, rank, at)
        elif what == "placed" and round_ is not None and rnd < round_:
            pass  # a round the job has moved past
        else:
            self._stash.append(message)

    def cpu(self) -> float:
        return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for ps in self.procs.values() for p in ps if p.is_alive())

    def close(self) -> None:
        self.stop.value = 1
        for procs in self.procs.values():
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()


PROCS = 4
SWITCH = float(os.environ.get("SCALE_SWITCH", 0.1))
VERBOSE = bool(os.environ.get("SCALE_VERBOSE"))


def _nodes(prefix: str, count: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(start, start + count)]


def _placed(job: Job, endpoint: str, count: int, round_: int, since: float, before: dict) -> tuple[dict, dict]:
    cpu = job.cpu()
    placed = job.collect("placed", count, round_)
    ranks = sorted(rank for _, rank, _ in placed.values())
    if ranks != list(range(count)):
        wrong = sorted(set(range(count)).symmetric_difference(ranks))[:10]
        raise RuntimeError(f"round {round_}: the ranks are not 0..{count - 1}: {len(ranks)} ranks, {wrong} differ")
    seconds = max(at for _, _, at in placed.values()) - since
    phase = spent(before, etcd_figures(endpoint), count, seconds)
    phase["clients_cpu"] = job.cpu() - cpu
    return phase, placed


def first_job(server, k: int, rack: int, steady: float, cpus: set[int]) -> dict:
    """The first round, the steady state, one node leaving, a rack lost."""
    endpoint = server.endpoints.split(",")[0]
    settings = RendezvousSettings(run_id=f"scale-{k}", min_nodes=max(k // 2, 1), max_nodes=k, join_timeout=TIMEOUT)
    groups = {"rest": _nodes("n", k - rack - 1), "rack": _nodes("r", rack), "leaver": ["leaver"]}
    job = Job(server.endpoints, settings.run_id, groups, settings, cpus)
    client, keys = EtcdClient(server.endpoints, timeout=60), JobKeys(settings.key_prefix, settings.run_id)
    phases: dict[str, dict] = {}
    try:
        before, c0, t0 = etcd_figures(endpoint), job.cpu(), time.time()
        job.go["rest"].set()
        _after_the_claim(client, keys)  # the rack and the leaver do not coordinate: they are lost
        job.go["rack"].set()
        job.go["leaver"].set()
        phases["first"], _ = _placed(job, endpoint, k, 1, t0, before)
        time.sleep(2.0)  # every node follows its round
        before, c0, t0 = etcd_figures(endpoint), job.cpu(), time.time()
        time.sleep(steady)
        phases["steady"] = spent(before, etcd_figures(endpoint), k, 1.0)  # per node and second
        seconds = time.time() - t0
        for key in ("etcd_cpu", "kb_sent", "kb_received", "events", "requests"):
            phases["steady"][key] /= seconds
        phases["steady"]["methods"] = {m: round(v / seconds, 3) for m, v in phases["steady"]["methods"].items()}
        phases["steady"]["etcd_cpu_share"] = phases["steady"]["etcd_cpu"]  # of one core, the job in all
        phases["steady"]["clients_cpu"] = (job.cpu() - c0) / seconds
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


def _count_request(prefix: str):
    from etcd3 import etcdrpc

    from rendezvous.etcd.txn import prefix_range_end

    key = prefix.encode()
    return etcdrpc.RangeRequest(key=key, range_end=prefix_range_end(key), count_only=True)


def late_job(server, k: int, cpus: set[int]) -> dict:
    """90 % of K form a round; then the last 10 % join: until all K hold their places."""
    endpoint = server.endpoints.split(",")[0]
    early = k - k // 10
    settings = RendezvousSettings(
        run_id=f"late-{k}", min_nodes=early, max_nodes=k, join_timeout=TIMEOUT, last_call_timeout=1.0
    )
    job = Job(
        server.endpoints, settings.run_id, {"early": _nodes("e", early), "late": _nodes("l", k // 10)}, settings, cpus
    )
    try:
        job.go["early"].set()
        job.collect("placed", early, 1)
        time.sleep(2.0)
        before, t0 = etcd_figures(endpoint), time.time()
        job.go["late"].set()
        phase, _ = _placed(job, endpoint, k, 2, t0, before)
        return phase
    finally:
        job.close()


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
    global PROCS, TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096,8192,10000")
    parser.add_argument("--procs", type=int, default=PROCS, help="processes of participants per job")
    parser.add_argument("--rack", type=int, default=256, help="nodes of the rack lost at once")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds the steady state is measured")
    parser.add_argument("--no-late", action="store_true", help="skip the late-join job")
    parser.add_argument("--json", default="", help="write every figure to this file")
    args = parser.parse_args()
    PROCS = args.procs
    cpus = set(range(os.cpu_count() or 1)) - {ETCD_CPU} or {ETCD_CPU}
    print(f"etcd on CPU {ETCD_CPU}, participants on CPU {','.join(map(str, sorted(cpus)))}", flush=True)
    print(HEAD, flush=True)
    results: dict[int, dict] = {}
    with EtcdServer(extra_args=ETCD_DEFAULTS) as server:
        pin(server.process.pid, str(ETCD_CPU))
        last: dict[str, dict] = {}
        for k in (int(s) for s in args.sizes.split(",")):
            try:
                phases = first_job(server, k, min(args.rack, k // 4), args.steady, cpus)
                if not args.no_late:
                    phases["late"] = late_job(server, k, cpus)
            except RuntimeError as exc:
                print(f"{k:>6} failed: {exc}", flush=True)
                last = {}
                continue
            results[k] = phases
            for name in PHASES:
                if name in phases:
                    print(row(k, name, phases[name], last.get(name)), flush=True)
            steady = phases["steady"]
            print(
                f"{k:>6} steady: etcd {steady['etcd_cpu']:.3f} CPU s a second ({steady['etcd_cpu'] * 1e6 / k:.1f} us "
                f"a node), {steady['requests'] * k:.0f} requests/s ({steady['requests']:.2f} a node), "
                f"{steady['kb_sent'] * k:.0f} KB/s out; the participants {steady['clients_cpu']:.2f} CPU s a second",
                flush=True,
            )
            last = phases
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({str(k): v for k, v in results.items()}, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
