"""``elastic-run --lighthouse ID``: a torchft Lighthouse replica beside this node's agent, so a torchft
job needs no Lighthouse deployment of its own. Every node's replica of the same ID serves one quorum
state in etcd; the workers get ``TORCHFT_LIGHTHOUSE`` (this node's replica) and, unless set,
``TORCHFT_QUORUM_RETRIES`` (a Manager then reconnects when its replica is restarted).

The replica is supervised: if it exits while the agent runs it is started again on the same ports
(said in one line). The agent holds both ports, the gRPC one and the status page's, from before the
first start to its own end (sockets that never listen, with SO_REUSEPORT as both servers bind): a
port the kernel chose (``--lighthouse-port 0``) is an ephemeral one, and without the hold an
outgoing connection or another server could take it while the replica is down, leaving the
workers' ``TORCHFT_LIGHTHOUSE`` pointing at a port no replica can listen on again. The kernel
chooses both ports at once when asked for 0: the port after a free one may well be taken.

It is started as the bundled etcd is (``rendezvous.processes.start_process``): in a session of
its own, with SIGTERM when the agent's thread that started it ends, also when the agent is killed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.workers.env import exported
from rendezvous.etcd.target import EtcdTarget
from rendezvous.processes import start_process, stop_process

__all__ = ["Beside", "hold_port", "lighthouse_beside", "replica_argv", "TARGET_FILE"]

TARGET_FILE = "etcd-target.json"  # EtcdTarget.to_json(), for the replica
_READY_WITHIN = 60.0  # seconds for a replica to listen (it waits for etcd meanwhile)
_QUORUM_RETRIES = "3"


@dataclass(frozen=True)
class Beside:
    """``--lighthouse ID``, ``--lighthouse-port``, ``--lighthouse-min-replicas``."""

    lighthouse_id: str
    port: int = 29510
    min_replicas: int = 1


def replica_argv(beside: Beside, key_prefix: str, ports: tuple[int, int], directory: str) -> list[str]:
    """The replica's command line, listening on ``ports`` (gRPC, status page): where etcd is, with
    the credentials, it reads from the target's JSON in ``directory`` (private to the agent), never
    from here."""
    return [
        sys.executable, "-m", "lighthouse",
        "--bind", f"[::]:{ports[0]}",
        "--http-bind", f"[::]:{ports[1]}",
        "--min_replicas", str(beside.min_replicas),
        "--etcd-target-file", str(Path(directory, TARGET_FILE)),
        "--rdzv-id", beside.lighthouse_id,
        "--rdzv-conf", f"key_prefix={key_prefix}",
        "--address-file", str(Path(directory, "address")),
    ]  # fmt: skip


def hold_port(port: int) -> socket.socket | None:
    """A socket bound to ``port`` (0: one the kernel chooses) on every address, never listening:
    while it is open no other process and no outgoing connection takes the port, and the replica's
    servers (SO_REUSEPORT, as gRPC and the status page bind) can bind it beside it. None where the
    port cannot be held."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
    return None


def _ports(held: list[socket.socket | None], port: int) -> tuple[int, int]:
    """The ports the replica listens on: those held, else the ones asked for (0 where the kernel
    chooses: the replica's own bind then picks them, and a restart may not get them again)."""
    asked = (port, port + 1 if port else 0)
    return tuple(sock.getsockname()[1] if sock is not None else want for sock, want in zip(held, asked))  # type: ignore[return-value]


class _Replica:
    def __init__(self, beside: Beside, target: EtcdTarget, key_prefix: str, report: Callable[[str], None]) -> None:
        self.beside, self.report = beside, report
        self._key_prefix = key_prefix
        self._dir = tempfile.mkdtemp(prefix="elastic-lighthouse-")  # mode 0700: the target holds the password
        target_file = Path(self._dir, TARGET_FILE)
        target_file.touch(mode=0o600)
        target_file.write_text(target.to_json())
        self._held = [hold_port(beside.port), hold_port(beside.port + 1 if beside.port else 0)]
        self.ports = _ports(self._held, beside.port)  # (gRPC, status page), held until stop()
        self._process: subprocess.Popen | None = None
        self._stop = threading.Event()
        self.address = ""

    def start(self) -> str:
        address_file = Path(self._dir, "address")
        address_file.unlink(missing_ok=True)
        argv = replica_argv(self.beside, self._key_prefix, self.ports, self._dir)
        # run in its private directory: a "lighthouse" in the job's working directory is not imported
        self._process = start_process(argv, str(Path(self._dir, "replica.log")), cwd=self._dir)
        deadline = time.monotonic() + _READY_WITHIN
        while not (address_file.exists() and address_file.read_text().strip()):
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = Path(self._dir, "replica.log").read_text(errors="replace").strip().splitlines()[-1:]
                stop_process(self._process)
                raise LauncherError(f"--lighthouse: the replica did not start ({' '.join(tail) or 'no output'})")
            time.sleep(0.05)
        self.address = address_file.read_text().strip()
        if not self.ports[0]:  # not held: a restart listens where the workers were told at least
            self.ports = (int(self.address.rsplit(":", 1)[1]), self.ports[1])
        return self.address

    def supervise(self) -> None:
        while not self._stop.wait(0.5):
            if self._process is not None and self._process.poll() is not None:
                self.report(
                    f"the lighthouse replica exited ({self._process.returncode}); "
                    f"starting it again on port {self.ports[0]}"
                )
                try:
                    self.start()
                except LauncherError as exc:
                    self.report(str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None:
            stop_process(self._process)
        for held in self._held:
            if held is not None:
                held.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def lighthouse_beside(
    beside: Beside | None, target: EtcdTarget, key_prefix: str, report: Callable[[str], None]
) -> Iterator[str | None]:
    """Run the replica for the block, with ``TORCHFT_LIGHTHOUSE`` set for the workers; its address."""
    if beside is None:
        yield None
        return
    replica = _Replica(beside, target, key_prefix, report)
    address = replica.start()
    report(
        f"torchft lighthouse {beside.lighthouse_id!r}: a replica at {address} (TORCHFT_LIGHTHOUSE; "
        f"status page on port {replica.ports[1]})"
    )
    watcher = threading.Thread(target=replica.supervise, name="lighthouse-supervisor", daemon=True)
    watcher.start()
    retries = os.environ.get("TORCHFT_QUORUM_RETRIES", _QUORUM_RETRIES)
    try:
        with exported({"TORCHFT_LIGHTHOUSE": address, "TORCHFT_QUORUM_RETRIES": retries}):
            yield address
    finally:
        replica.stop()
        watcher.join(5)
