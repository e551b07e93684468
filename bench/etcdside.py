"""etcd's side of the scale benchmarks (``bench/scale.py``, ``bench/etcd_capacity.py``): its own
counters read from ``/metrics``, what it spent between two readings, and its process pinned to one
CPU so that the load never takes its core."""

from __future__ import annotations

import contextlib
import os
import subprocess
import urllib.request
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ETCD_CPU", "ETCD_DEFAULTS", "etcd_figures", "spent", "pin", "pinned_etcd"]

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


@contextlib.contextmanager
def pinned_etcd(*extra_args: str) -> Iterator:
    """The bundled etcd, one member, pinned to CPU ``ETCD_CPU``, its Go runtime told it has one CPU
    (``GOMAXPROCS=1``; else it runs as many threads as the machine has CPUs on that one), with
    etcd's default raft timing."""
    from rendezvous import EtcdServer

    before = os.environ.get("GOMAXPROCS")
    os.environ["GOMAXPROCS"] = "1"
    try:
        server = EtcdServer(extra_args=(*ETCD_DEFAULTS, *extra_args)).start()
    finally:
        if before is None:
            os.environ.pop("GOMAXPROCS", None)
        else:
            os.environ["GOMAXPROCS"] = before
    try:
        pin(server.process.pid, str(ETCD_CPU))
        yield server
    finally:
        server.stop()
