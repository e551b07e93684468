"""What a job costs the etcd it lives on: bytes written, bytes left behind, writes at steady state,
and the database's size after many jobs.

    python bench/footprint.py [--sizes 2,16,128,1024] [--jobs 30] [--steady 15]

Per K (participants as threads, each its own client, lease, handler and history writer, as agents):

- ``round KB``: bytes of every key and value put under the job's prefix while its first round formed
  and froze (etcd keeps each in its history until compaction), and per node;
- ``left KB``: under the job's prefix once the job closed and every node left, then after its
  retention (``retention=5`` here; the default keeps a finished job's keys for 3 days);

Then, with real agents (``elastic-run``, 2 nodes, workers calling ``elastic.heartbeat()`` every
50 ms): etcd's revision and the requests each node sends per minute over ``--steady`` seconds of a
job where nothing changes. Last, ``--jobs`` jobs of ``--job-size`` nodes in a row on an etcd without
compaction and on one compacting every second: the database's size and the bytes in use.

The same file runs against an older checkout (``PYTHONPATH=<checkout> python bench/footprint.py``):
it finds the modules where either layout keeps them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rendezvous import EtcdClient, EtcdServer  # noqa: E402
from rendezvous.settings import RendezvousSettings  # noqa: E402

try:  # this layout
    from rendezvous.etcd.watch import EventType, KeyRange, Watch
    from rendezvous.job.history import HistoryWriter
    from rendezvous.rounds.handler import RendezvousHandler
except ImportError:  # the flat layout before it
    from rendezvous.handler import RendezvousHandler  # type: ignore[no-redef]
    from rendezvous.history import HistoryWriter  # type: ignore[no-redef]
    from rendezvous.watch import EventType, KeyRange, Watch  # type: ignore[no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
BEATS = os.path.join(os.path.dirname(HERE), "tests", "ops", "workers", "beats.py")
PREFIX = "/elastic"


class Written:
    """Every put under a prefix from now on, as etcd's watch delivers it: their bytes."""

    def __init__(self, client: EtcdClient, prefix: str) -> None:
        _, revision = client.get_prefix(prefix, keys_only=True)
        self.bytes = 0
        self._watch = Watch(client, KeyRange(prefix, prefix=True), start_revision=revision + 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._watch.get(timeout=0.2)
            if event is not None and event.type is EventType.PUT:
                self.bytes += len(event.key) + len(event.value)

    def take(self, settle: float = 0.5) -> int:
        time.sleep(settle)
        taken, self.bytes = self.bytes, 0
        return taken

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._watch.close()


def _left(client: EtcdClient, run_id: str) -> int:
    kvs, _ = client.get_prefix(f"{PREFIX}/{run_id}/")
    return sum(len(kv.key) + len(kv.value) for kv in kvs)


RETENTION = 5  # seconds a finished job's keys stay, here (the default is 3 days)


def _settings(run_id: str, k: int) -> RendezvousSettings:
    conf = f"last_call_timeout=0,join_timeout=300,retention={RETENTION}"
    try:
        return RendezvousSettings.from_conf(run_id, k, k, conf)
    except ValueError:  # no retention before this change
        return RendezvousSettings.from_conf(run_id, k, k, "last_call_timeout=0,join_timeout=300")


def one_job(endpoints: str, run_id: str, k: int, written: Written | None = None) -> dict[str, float]:
    """K participants: a round, then the end of the job as agents end it."""
    settings = _settings(run_id, k)
    clients = [EtcdClient(endpoints, timeout=30) for _ in range(k)]
    writers = [HistoryWriter(c, f"{PREFIX}/{run_id}/", f"n{i:05d}") for i, c in enumerate(clients)]
    handlers = [
        RendezvousHandler(c, settings, node_id=f"n{i:05d}", local_addr="10.0.0.1", local_world_size=8, history=w)
        for i, (c, w) in enumerate(zip(clients, writers))
    ]
    infos: dict[int, object] = {}

    def join(i: int) -> None:
        infos[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(infos) == k, f"{len(infos)} of {k} joined"
    round_bytes = written.take() if written is not None else 0

    def end(handler: RendezvousHandler) -> None:  # the agent's exit barrier
        handler.finish()
        if handler.all_finished(timeout=60):
            handler.set_closed("the job ended")

    threads = [threading.Thread(target=end, args=(h,)) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for h, w, info in zip(handlers, writers, infos.values()):
        _left_record(w, info.round)
        w.close()
        h.shutdown()
    for c in clients:
        c.close()
    return {"round": round_bytes}


def _left_record(writer: HistoryWriter, round_: int) -> None:
    """What an agent leaving a finished job records: this layout's only echoes it (the job's
    job_closed record says it all); the layout before wrote one record a node."""
    try:
        writer.record("node_left", round_, store=False, reason="finished: its workers succeeded")
    except TypeError:
        writer.record("node_left", round_, reason="finished: its workers succeeded")


def sizes_table(endpoints: str, sizes: list[int]) -> None:
    print(f"{'K':>6} {'round KB':>10} {'KB/node':>9} {'left KB':>9} {'KB/node':>9} {'after retention KB':>19}")
    with EtcdClient(endpoints) as client:
        for k in sizes:
            run_id = f"fp-{k}"
            written = Written(client, f"{PREFIX}/{run_id}/")
            got = one_job(endpoints, run_id, k, written)
            written.close()
            left = _left(client, run_id)
            time.sleep(RETENTION + 2.0)
            after = _left(client, run_id)
            print(
                f"{k:>6} {got['round'] / 1024:>10.1f} {got['round'] / 1024 / k:>9.2f} {left / 1024:>9.1f} "
                f"{left / 1024 / k:>9.2f} {after / 1024:>19.1f}",
                flush=True,
            )


def _calls(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("grpc_server_handled_total{", "grpc_server_msg_received_total{")):
            unary = 'grpc_type="unary"' in line
            if unary != line.startswith("grpc_server_handled_total"):
                continue
            method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
            counts[method] = counts.get(method, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def steady(seconds: float) -> None:
    """Two real agents whose workers beat; what etcd sees while nothing changes."""
    tool = os.path.join(os.path.dirname(sys.executable), "elastic-run")
    with EtcdServer() as etcd, EtcdClient(etcd.endpoints) as client, tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "steady"]
        agents = [
            subprocess.Popen([tool, *args, BEATS, "--stop", stop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(2)
        ]
        try:
            time.sleep(8.0)  # the round forms (last call 30 s at most: max nodes join at once), workers beat
            r0, c0 = client.status().header.revision, _calls(etcd.client_urls[0])
            time.sleep(seconds)
            r1, c1 = client.status().header.revision, _calls(etcd.client_urls[0])
        finally:
            open(stop, "w").close()
            for agent in agents:
                agent.wait(60)
    per_minute = 60.0 / seconds / 2
    delta = {m: (c1.get(m, 0) - c0.get(m, 0)) * per_minute for m in c1}
    delta.pop("Status", None)  # this bench's own
    writes = sum(v for m, v in delta.items() if m in ("Put", "Txn", "DeleteRange", "LeaseGrant"))
    print(
        f"steady state, 2 nodes, {seconds:g} s: revision +{r1 - r0} ({(r1 - r0) * per_minute:.1f} writes a node a "
        f"minute); requests a node a minute: {sum(delta.values()):.1f} "
        f"({', '.join(f'{m} {v:.1f}' for m, v in sorted(delta.items()) if v)}); writes {writes:.1f}"
    )


def _in_use(url: str) -> float:
    """etcd's own figure of the bytes its database holds (free pages, as compaction leaves them, not counted)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_mvcc_db_total_size_in_use_in_bytes "):
            return float(line.split()[1])
    return 0.0


def many_jobs(count: int, size: int) -> None:
    for label, extra in (
        ("no compaction", ["--auto-compaction-retention=0"]),
        ("compaction every 1 s", ["--auto-compaction-mode=periodic", "--auto-compaction-retention=1s"]),
    ):
        with EtcdServer(extra_args=extra) as etcd, EtcdClient(etcd.endpoints) as client:
            for j in range(count):
                one_job(etcd.endpoints, f"many-{j}", size)
            time.sleep(RETENTION + 2.0)  # the finished jobs' keys go; compaction runs
            status = client.status()
            in_use = _in_use(etcd.client_urls[0])
            left = sum(len(kv.key) + len(kv.value) for kv in client.get_prefix(PREFIX + "/")[0])
            print(
                f"{count} jobs of {size} nodes, {label}: revision {status.header.revision}, database "
                f"{status.dbSize / 1024:.0f} KiB ({in_use / 1024:.0f} KiB in use), {left / 1024:.1f} KB of keys left"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,16,128")
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--job-size", type=int, default=32, help="nodes of each of the --jobs jobs")
    parser.add_argument("--steady", type=float, default=15.0)
    opts = parser.parse_args()
    with EtcdServer() as etcd:
        sizes_table(etcd.endpoints, [int(k) for k in opts.sizes.split(",")])
    steady(opts.steady)
    many_jobs(opts.jobs, opts.job_size)


if __name__ == "__main__":
    main()
