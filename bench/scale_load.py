"""The participants of ``bench/scale.py``: real rendezvous handlers, many to a process sharing one
client (one gRPC channel), one thread each (``participants``, driven by ``Job``); and quiet nodes, as a
training job's agents look to etcd -- a lease kept alive and a round's watch each (``quiet_participants``).
Every process is pinned off etcd's CPU."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time

import psutil

from rendezvous import EtcdClient
from rendezvous.etcd.session import Session, default_renew_deadline, keep_alive_interval
from rendezvous.etcd.watch import KeyRange, Watch
from rendezvous.job.keys import JobKeys
from rendezvous.rounds.handler import RendezvousHandler
from rendezvous.settings import RendezvousSettings

TIMEOUT = float(os.environ.get("SCALE_TIMEOUT", 300.0))
PROCS = 4  # processes of participants per group (``--procs``)
TTL = 15  # the leases' TTL (``--ttl``)
SWITCH = float(os.environ.get("SCALE_SWITCH", 0.1))
VERBOSE = bool(os.environ.get("SCALE_VERBOSE"))


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

    def __init__(self, endpoints: str, groups: dict[str, list[str]], settings, cpus: set[int], target=None) -> None:
        """``target``: what a process of a group runs (``participants``): one for every group, or by group name."""
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
                    target=(target.get(name, participants) if isinstance(target, dict) else target) or participants,
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
        return 1 if name in ("leaver", "rack", "coord") else max(1, min(PROCS, count))

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


def _lease(k: int) -> dict:
    """The leases' TTL (``--ttl``), renewed as a job of ``k`` nodes renews them by default (15 s)."""
    return {"lease_ttl": TTL, "keep_alive_interval": keep_alive_interval(default_renew_deadline(15), k)}


def _nodes(prefix: str, count: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(start, start + count)]


def quiet_participants(endpoints: str, settings: RendezvousSettings, nodes: list[str], cpus: set[int], events) -> None:
    """A process of nodes as a running job's agents look to etcd while they train: each a lease kept
    alive as the job's size says (``Session``) and its round's monitor, a watch on the state and the
    coordinator's key (``Watch``) -- the project's classes, one client a process. ``bench/scale.py``'s
    steady phase of real handlers asks etcd for the same (``--steady-only`` prints both to compare)."""
    os.sched_setaffinity(0, cpus)
    go, out, stopped = events
    client = EtcdClient(endpoints, timeout=120)
    keys = JobKeys(settings.key_prefix, settings.run_id)
    revision = client.range(_count_request(keys.state)).header.revision
    sessions = [
        Session(client, settings.lease_ttl, renew_deadline=settings.fence_after, interval=settings.renew_every)
        for _ in nodes
    ]
    watches = [Watch(client, KeyRange(keys.state), KeyRange(keys.coordinator), start_revision=revision) for _ in nodes]
    out.put(("ready", nodes[0], len(nodes), 0, time.time()))
    while not stopped.value:
        time.sleep(0.2)
    for watch in watches:
        watch.close(wait=False)
    for session in sessions:
        session.close()
    client.close()


def _count_request(prefix: str):
    from etcd3 import etcdrpc

    from rendezvous.etcd.txn import prefix_range_end

    key = prefix.encode()
    return etcdrpc.RangeRequest(key=key, range_end=prefix_range_end(key), count_only=True)
