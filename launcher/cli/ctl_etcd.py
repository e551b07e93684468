"""``elastic-ctl etcd``: a local etcd of one or more members from the bundled binary, to try a
multi-node job on one machine without Docker. It runs in the foreground until Ctrl-C (or SIGTERM),
then stops every member and removes the data it made. A member that exits is said, and the others
go on (as a real cluster would: kill one to see a job ride through it)."""

from __future__ import annotations

import errno
import socket

import click

from launcher.signals import stop_requested
from rendezvous.errors import RendezvousConnectionError
from rendezvous.etcd.server import EtcdCluster, started_etcd

__all__ = ["ctl_etcd"]

_CHECK_EVERY = 1.0  # seconds between looks at the members' processes


@click.command("etcd")
@click.option("--members", type=click.IntRange(1, 9), default=3, show_default=True, help="etcd members to start.")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address every member listens on.")
@click.option(
    "--port",
    type=click.IntRange(1, 65535 - 18),
    default=2379,
    show_default=True,
    help="Member i serves clients on PORT+2i and its peers on PORT+2i+1.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the members' data here, across runs (default: a temporary directory, removed on exit).",
)
def ctl_etcd(members: int, host: str, port: int, data_dir: str | None) -> int:
    """Run a local etcd of --members members until Ctrl-C, for jobs on this machine."""
    _check_ports(host, port, members)
    cluster = EtcdCluster(members, host=host, base_port=port, data_dir=data_dir)
    with stop_requested() as stopped:
        try:
            cluster.start()  # a port in use: "etcd did not start: ... bind: address already in use"
            kept = "kept" if data_dir else "removed on exit"
            click.echo(
                f"etcd: {members} member{'s' if members > 1 else ''} on {host}, data in {cluster.data_dir} ({kept}); "
                f"{started_etcd(cluster.binary_used)}"
            )
            click.echo(f"  --rdzv-endpoint {cluster.endpoints}")
            click.echo(f"  or, in each shell: export PET_RDZV_ENDPOINT={cluster.endpoints}")
            click.echo("  (elastic-run, elastic-ctl and torchrun read it when the option is not given)")
            click.echo("Ctrl-C stops it.", err=True)
            said: set[str] = set()
            while not stopped(_CHECK_EVERY):
                _say_exits(cluster.exited(), said, members)
            click.echo("etcd: stopped", err=True)
            return 0
        finally:
            cluster.stop()


def _say_exits(gone: list[tuple[str, str]], said: set[str], members: int) -> None:
    """A line for each member that exited (a quorum of the others goes on); an error once none is left.
    Said once a member, by name: its log's last line may change between looks."""
    for name, line in gone:
        if name not in said:
            said.add(name)
            click.echo(f"etcd: member {line}; {members - len(said)} of {members} go on", err=True)
    if len(said) == members:
        raise RendezvousConnectionError("every etcd member exited")


def _check_ports(host: str, port: int, members: int) -> None:
    """Every port the members need can be listened on; else one line saying which cannot, and why."""
    last = port + 2 * members - 1
    for each in range(port, last + 1):
        refused = _bind_error(host, each)
        if refused is not None and refused.errno == errno.EADDRINUSE:
            raise click.UsageError(
                f"port {each} on {host} is in use (another etcd?); the members need ports {port} to {last}: "
                "choose others with --port"
            )
        if refused is not None:
            raise click.UsageError(
                f"cannot listen on {host}:{each} ({refused.strerror}): --host must be an address of this machine"
            )


def _bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on (None: it can)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None
