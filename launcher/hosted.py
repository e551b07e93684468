"""The job's etcd hosted by one of its agents, so that torchrun's c10d command lines run unchanged.

torchrun's c10d backend keeps the rendezvous in a TCPStore served by the agent on the machine the
endpoint names (``--rdzv-endpoint node0:29400``, port 29400 when none is given); the other agents
connect to it, and an agent there that finds the port taken connects too. elastic-run does the same
with an etcd: on the endpoint's machine, the agent that takes the port first starts a one-member
etcd serving it there (its data in a temporary directory, removed at the end); every other agent
is a client of it. torch's ``is_host`` key (``--rdzv-conf is_host=true|false``) overrides the
machine match, as it does for c10d.

What that trades is c10d's: the job hangs on that one machine. When its agent ends, the job's etcd
ends with it -- and the job's history, which ``elastic-ctl`` reads only while the job runs. So the
hosting agent, before it stops the etcd, waits (bounded) for the other agents to leave.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from launcher.errors import UsageError
from rendezvous.etcd.server import EtcdServer

__all__ = [
    "C10D_PORT",
    "Hosting",
    "c10d_endpoint",
    "alone_on_port_0",
    "matches_machine",
    "hosting_here",
    "bind_address",
    "port_free",
    "HostedEtcd",
    "host_etcd",
    "wait_alone",
]

C10D_PORT = 29400  # torchrun's c10d port when the endpoint names none


@dataclass(frozen=True)
class Hosting:
    """A c10d line's endpoint: where its etcd is served, and torch's ``is_host`` override (None: by the machine)."""

    host: str
    port: int
    is_host: bool | None = None

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def c10d_endpoint(text: str, is_host: str | None = None, *, free_port: bool = False) -> Hosting:
    """``host[:port]`` (``[v6]:port`` too) of a c10d line; port 29400 when none is given, as torchrun
    (``free_port``: port 0 is taken as given, for the caller to tell a single-node line by)."""
    value = text.strip()
    if "," in value:
        raise UsageError(f"--rdzv-backend c10d takes one host[:port], not {text!r}")
    host, port = value, str(C10D_PORT)
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not host or not port.isdigit() or not (0 if free_port else 1) <= int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint {text!r}: c10d's endpoint is host[:port] with a port from 1 to 65535")
    return Hosting(host, int(port), _flag(is_host))


def alone_on_port_0(hosting: Hosting, max_nodes: int) -> bool:
    """torchrun's single-node line, ``--rdzv-endpoint localhost:0``: port 0 is a free port, which
    only this node can find, so the job runs here alone; for more nodes it is a UsageError."""
    if hosting.port != 0:
        return False
    if max_nodes > 1:
        raise UsageError(
            f"--rdzv-endpoint {hosting.endpoint!r}: port 0 (a free port) serves one node only; name a port"
        )
    return True


def _flag(text: str | None) -> bool | None:
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y"):
        return True
    if value in ("0", "false", "f", "no", "n"):
        return False
    raise UsageError(f"--rdzv-conf is_host={text!r}: true or false")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def matches_machine(host: str, host_ips: Iterable[str], names: Iterable[str], ips: Iterable[str]) -> bool:
    """Whether ``host`` names this machine: a loopback name or address, one of its ``names``
    (hostname, FQDN, canonical names), or an address it resolves to that is one of ``ips``."""
    if _loopback(host) or host in set(names):
        return True
    return bool(set(host_ips) & set(ips))


def _addresses(name: str) -> tuple[list[str], list[str]]:
    """(the addresses ``name`` resolves to, its canonical names); nothing when it does not resolve."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP, flags=socket.AI_CANONNAME)
    except (OSError, UnicodeError):
        return [], []
    return [str(info[4][0]) for info in infos], [info[3] for info in infos if info[3]]


def hosting_here(hosting: Hosting) -> bool:
    """Whether this machine is the endpoint's host (``is_host`` decides when given)."""
    if hosting.is_host is not None:
        return hosting.is_host
    host_ips, _ = _addresses(hosting.host)
    here = socket.gethostname()
    ips, canonical = _addresses(here)
    return matches_machine(hosting.host, host_ips, [here, socket.getfqdn(), *canonical], ips)


def bind_address(host: str) -> str:
    """The address etcd listens on for ``host``: loopback for a loopback name, else what it resolves to."""
    if _loopback(host):
        return "127.0.0.1" if host == "localhost" else host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    host_ips, _ = _addresses(host)
    if not host_ips:
        raise UsageError(f"--rdzv-endpoint {host!r}: the name does not resolve on this machine")
    return sorted(host_ips, key=lambda ip: ":" in ip)[0]  # IPv4 first, as most clients try it


def port_free(address: str, port: int) -> bool:
    """Whether ``port`` can be listened on at ``address`` now (a probe: it is released at once)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as etcd binds: past TIME_WAIT, not a listener
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def wait_alone(
    others: Callable[[], int], bound: float, report: Callable[[str], None], *, clock=time.monotonic, nap=time.sleep
) -> int:
    """Wait up to ``bound`` seconds until ``others()`` (the other agents still in the job) is 0; the count left."""
    deadline, said = clock() + bound, False
    while True:
        left = others()
        if left == 0 or clock() >= deadline:
            return left
        if not said:
            report(
                f"hosting the job's etcd: waiting up to {bound:g} s for {left} other node(s) to leave before it stops"
            )
            said = True
        nap(0.2)


class HostedEtcd(EtcdServer):
    """The job's etcd on this machine, with the lock that made this agent its only host here."""

    def __init__(self, lock: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self._lock = lock

    def stop(self) -> None:
        super().stop()
        if self._lock >= 0:
            os.close(self._lock)  # the next agent here may host the port again
            self._lock = -1


def _host_lock(port: int) -> int | None:
    """An exclusive lock on hosting ``port`` on this machine (held until closed or this process
    dies); None when another agent here holds it. Two agents started together both find the port
    free, and a second etcd on a taken port still looks healthy -- through the first one."""
    path = os.path.join(tempfile.gettempdir(), f"elastic-run-c10d-{port}.lock")
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def host_etcd(hosting: Hosting, report: Callable[[str], None]) -> HostedEtcd | None:
    """The job's etcd, started here when this machine is the endpoint's host and the port is free;
    None when another agent serves it (as torch's c10d agent becomes a client when the port is taken)."""
    if not hosting_here(hosting):
        return None
    address = bind_address(hosting.host)
    lock = _host_lock(hosting.port)
    if lock is not None and port_free(address, hosting.port):
        server = HostedEtcd(lock, host=address, client_port=hosting.port)
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        report(f"--rdzv-backend c10d: this agent hosts the job's etcd on {hosting.endpoint}; it ends with this agent")
        return server
    if lock is not None:
        os.close(lock)
    report(f"--rdzv-backend c10d: {hosting.endpoint} is served on this machine already; joining the job there")
    return None
