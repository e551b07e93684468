"""The etcd member a SLURM node runs for its job (``launcher.slurm.job`` decides the layout): started
before the agent connects, from the bundled binary, with the compaction and quota every etcd of this
project runs with; its data in node-local temporary space, removed when the agent exits; the process
dies with the agent (a parent-death signal), so nothing of it outlives the job."""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from rendezvous.errors import RendezvousConnectionError
from rendezvous.etcd import server
from rendezvous.etcd.server import HEALTH_ARGS, find_etcd_binary
from rendezvous.processes import start_process, stop_process

from .job import AllocationEtcd, Member

__all__ = ["allocation_member", "member_command"]


def member_command(binary: str, layout: AllocationEtcd, member: Member, data_dir: str) -> list[str]:
    """etcd's command line for ``member``: it listens on its address when that is an IP, else on
    every interface (etcd takes no host name there, and a name's local lookup may give a loopback
    address the other nodes cannot reach), and is advertised under the address the others know."""
    ip = member.addr if _is_ip(member.addr) else "0.0.0.0"
    urls = (
        f"http://{ip}:{member.client_port}",
        f"http://{member.addr}:{member.client_port}",
        f"http://{ip}:{member.peer_port}",
        f"http://{member.addr}:{member.peer_port}",
    )
    return server.member_command(binary, member.name, data_dir, urls, layout.initial_cluster, layout.token, HEALTH_ARGS)


# SIGTERM to SIGKILL for this node's member: a leader hands over in milliseconds while its peers are
# up; when the whole allocation stops at once (scancel), a member left without its peers takes
# longer than a grace period has to give, and its data is removed with it anyway.
MEMBER_STOP_GRACE = 2.0


@contextmanager
def allocation_member(layout: AllocationEtcd | None, say) -> Iterator[None]:
    """Run this node's member of the allocation's etcd (if it has one) for the duration of the block."""
    member = layout.mine if layout is not None else None
    if member is None:
        yield
        return
    data_dir = tempfile.mkdtemp(prefix=f"{layout.token}-{member.name}-")
    try:
        command = member_command(find_etcd_binary(), layout, member, os.path.join(data_dir, "data"))
        process = start_process(command, os.path.join(data_dir, "etcd.log"))
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise RendezvousConnectionError(f"the allocation's etcd member {member.name} did not start: {exc}") from None
    say(f"etcd member {member.name} of the allocation on {member.client} (members: {layout.endpoints})")
    try:
        yield
    finally:
        stop_process(process, grace=MEMBER_STOP_GRACE)
        shutil.rmtree(data_dir, ignore_errors=True)


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return True
