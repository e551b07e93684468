"""The etcd member a SLURM node runs for its job (``launcher.slurm`` decides the layout): started
before the agent connects, from the bundled binary, with the compaction and quota every etcd of this
project runs with; its data in node-local temporary space, removed when the agent exits; the process
dies with the agent (a parent-death signal), so nothing of it outlives the job."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from rendezvous.errors import RendezvousConnectionError
from rendezvous.etcd.lifeline import die_with_parent
from rendezvous.etcd.server import HEALTH_ARGS, find_etcd_binary

from .slurm import AllocationEtcd, Member

__all__ = ["allocation_member", "member_command"]

_STOP_GRACE = 5.0


def member_command(binary: str, layout: AllocationEtcd, member: Member, data_dir: str) -> list[str]:
    """etcd's command line for ``member``: it listens on its address when that is an IP, else on
    every interface (etcd takes no host name there, and a name's local lookup may give a loopback
    address the other nodes cannot reach), and is advertised under the address the others know."""
    ip = member.addr if _is_ip(member.addr) else "0.0.0.0"
    return [
        binary,
        "--name",
        member.name,
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        f"http://{ip}:{member.client_port}",
        "--advertise-client-urls",
        f"http://{member.addr}:{member.client_port}",
        "--listen-peer-urls",
        f"http://{ip}:{member.peer_port}",
        "--initial-advertise-peer-urls",
        f"http://{member.addr}:{member.peer_port}",
        "--initial-cluster",
        layout.initial_cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        layout.token,
        "--log-level",
        "error",
        *HEALTH_ARGS,
    ]


@contextmanager
def allocation_member(layout: AllocationEtcd | None, say) -> Iterator[None]:
    """Run this node's member of the allocation's etcd (if it has one) for the duration of the block."""
    member = layout.mine if layout is not None else None
    if member is None:
        yield
        return
    data_dir = tempfile.mkdtemp(prefix=f"{layout.token}-{member.name}-")
    log_path = os.path.join(data_dir, "etcd.log")
    try:
        command = member_command(find_etcd_binary(), layout, member, os.path.join(data_dir, "data"))
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                die_with_parent(command, "TERM"), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise RendezvousConnectionError(f"the allocation's etcd member {member.name} did not start: {exc}") from None
    say(f"etcd member {member.name} of the allocation on {member.client} (members: {layout.endpoints})")
    try:
        yield
    finally:
        _stop(process)
        shutil.rmtree(data_dir, ignore_errors=True)


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return True


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_STOP_GRACE)
