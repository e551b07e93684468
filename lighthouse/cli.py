"""``elastic-lighthouse``: torchft's Lighthouse served from etcd. It takes ``torchft_lighthouse``'s
flags and defaults, and this project's etcd flags; any number of replicas started with the same
``--rdzv-id`` serve one quorum state, and a Manager may talk to any of them.

It runs until SIGTERM or Ctrl-C; stopping revokes its lease, so another replica leads at once."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import click
import grpc

from launcher.errors import UsageError
from launcher.signals import stop_requested
from lighthouse.book import LighthouseKeys
from lighthouse.quorum import Rules
from lighthouse.replica import Replica
from lighthouse.service import serve
from lighthouse.status import StatusPage
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.endpoints import Endpoint
from rendezvous.etcd.target import EtcdTarget
from rendezvous.settings import RendezvousSettings

__all__ = ["elastic_lighthouse", "split_bind", "status_port"]


def split_bind(bind: str, flag: str = "--bind") -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); click's BadParameter naming ``flag`` when it is neither."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise click.BadParameter(f"{bind!r} is not host:port (as [::]:29510)", param_hint=flag)
    return host.strip("[]"), int(port)


def status_port(port: int) -> int:
    """The status page's default port: the one after the gRPC port (a free one when that is 0)."""
    return port + 1 if port else 0


def _advertised(host: str, port: int, given: str | None) -> str:
    if given:
        return f"{given}:{port}"
    if host in ("", "::", "0.0.0.0"):
        host = socket.gethostname()
    return Endpoint(host, port).target


@click.command("elastic-lighthouse", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--bind", default="[::]:29510", show_default=True, help="Address to bind the gRPC server to.")
@click.option(
    "--min_replicas",
    "--min-replicas",
    type=click.IntRange(0),
    required=True,
    help="Minimum number of replica groups for a quorum.",
)
@click.option(
    "--join_timeout_ms",
    "--join-timeout-ms",
    type=click.IntRange(0),
    default=60000,
    show_default=True,
    help="How long to wait for heartbeating stragglers to join before issuing a quorum.",
)
@click.option(
    "--quorum_tick_ms",
    "--quorum-tick-ms",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="How often to check for a quorum while waiting for stragglers.",
)
@click.option(
    "--heartbeat_timeout_ms",
    "--heartbeat-timeout-ms",
    type=click.IntRange(1),
    default=5000,
    show_default=True,
    help="How long without a heartbeat before a replica group counts as dead.",
)
@click.option(
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    envvar="PET_RDZV_ENDPOINT",
    default=None,
    help="etcd endpoints, host:port[,...] (required).",
)
@click.option(
    "--rdzv-id",
    "--rdzv_id",
    default="lighthouse",
    show_default=True,
    help="Replicas with the same id serve one quorum state.",
)
@click.option(
    "--rdzv-conf",
    "--rdzv_conf",
    envvar="PET_RDZV_CONF",
    default="",
    help="key_prefix, read_timeout, TLS and user settings, key=value,...",
)
@click.option(
    "--http-bind", default=None, help="Address of the HTTP status page [default: --bind's host, its port + 1]."
)
@click.option(
    "--advertise-host",
    default=None,
    help="The host other replicas reach this one at [default: the bind host, or this machine's name].",
)
@click.option(
    "--lease-ttl",
    type=click.IntRange(2, 60),
    default=5,
    show_default=True,
    help="Seconds a dead replica keeps the lead.",
)
@click.option("--address-file", type=click.Path(dir_okay=False), default=None, hidden=True)
@click.option("--etcd-target-file", type=click.Path(dir_okay=False), default=None, hidden=True)
@click.version_option(package_name="etcd-elastic", prog_name="elastic-lighthouse", message="%(prog)s %(version)s")
def elastic_lighthouse(**opts: Any) -> int:
    """torchft's Lighthouse (Quorum, Heartbeat, status page), its state kept in etcd."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    host, port = split_bind(opts["bind"])
    say = lambda line: click.echo(f"elastic-lighthouse: {line}", err=True)  # noqa: E731
    settings = RendezvousSettings.from_conf(opts["rdzv_id"], 1, 1, opts["rdzv_conf"], warn=say)
    client = EtcdClient(_target(opts, settings))
    keys = LighthouseKeys(settings.key_prefix, opts["rdzv_id"])
    client.wait_ready(keys.leader, settings.connect_timeout, report=say)
    rules = Rules(
        min_replicas=opts["min_replicas"],
        join_timeout=opts["join_timeout_ms"] / 1000,
        heartbeat_timeout=opts["heartbeat_timeout_ms"] / 1000,
        quorum_tick=opts["quorum_tick_ms"] / 1000,
    )
    replica = Replica(
        client, keys, rules, address="", name="", lease_ttl=opts["lease_ttl"], retention=settings.retention
    )
    server, bound = _listen(replica, host, port, opts["bind"])
    replica.address = _advertised(host, bound, opts["advertise_host"])
    replica.name = f"{socket.gethostname()}-{bound}-{os.getpid()}"
    page = _status_page(replica, opts["http_bind"], host, port, server)
    replica.start()
    address = f"http://{socket.gethostname()}:{bound}"
    click.echo(
        f"Lighthouse listening on: {address} (status page on port {page.port}; etcd key prefix {keys.root})", err=True
    )
    if opts["address_file"]:
        Path(opts["address_file"]).write_text(address + "\n")
    with stop_requested() as stopped:  # until SIGTERM or Ctrl-C, which the shutdown is not cut by
        while not stopped(3600.0):
            pass
        replica.stop()
        server.stop(grace=1).wait(2)
        page.stop()
    return 0


def _target(opts: dict[str, Any], settings: RendezvousSettings) -> EtcdTarget:
    """Where etcd is: --rdzv-endpoint with the conf's TLS and user, or the target an agent wrote for
    the replica it runs beside it (``--lighthouse``)."""
    if opts["etcd_target_file"]:
        return EtcdTarget.from_json(Path(opts["etcd_target_file"]).read_text())
    if not opts["rdzv_endpoint"]:
        raise UsageError("--rdzv-endpoint is required (host:port of etcd)")
    return settings.target(opts["rdzv_endpoint"])


def _listen(replica: Replica, host: str, port: int, bind: str) -> tuple[grpc.Server, int]:
    try:
        return serve(replica, Endpoint(host, port).target)
    except (OSError, RuntimeError):
        raise UsageError(
            f"--bind {bind}: cannot listen there (the port is in use, or not this host's address)"
        ) from None


def _status_page(replica: Replica, http_bind: str | None, host: str, port: int, server: grpc.Server) -> StatusPage:
    """The status page on ``--http-bind``, else on the gRPC port ``port`` asked for + 1 (a free one
    when that is 0: the port after a free one may well be taken)."""
    http_host, http_port = split_bind(http_bind, "--http-bind") if http_bind else (host, status_port(port))
    try:
        page = StatusPage(replica, http_host, http_port)
    except OSError as exc:
        server.stop(0)
        raise UsageError(
            f"the status page cannot listen on {http_host}:{http_port} ({exc}); give --http-bind"
        ) from None
    page.start()
    return page
