"""``elastic-lighthouse`` processes for the tests: started with an address file, read from a log the
test can print, and always killed at the end; and torchft's ``LighthouseServer`` as a shim over one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

LIGHTHOUSE = str(Path(sys.executable).with_name("elastic-lighthouse"))


class Lighthouse:
    """One replica: ``address()`` as torchft's LighthouseServer gives it, ``shutdown()`` as it."""

    def __init__(self, endpoints: str, rdzv_id: str, workdir: Path, *args: str, bind: str = "[::]:0") -> None:
        self.workdir = workdir
        stem = f"lighthouse-{uuid.uuid4().hex[:8]}"
        self.address_file = workdir / f"{stem}.addr"
        self.log = workdir / f"{stem}.log"
        argv = [LIGHTHOUSE, "--bind", bind, "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id]
        argv += ["--address-file", str(self.address_file), "--http-bind", "127.0.0.1:0", *args]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._address = self._wait_address(30.0)

    def _wait_address(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.address_file.exists() and self.address_file.read_text().strip():
                return self.address_file.read_text().strip()
            if self.process.poll() is not None:
                raise AssertionError(f"elastic-lighthouse exited {self.process.returncode}:\n{self.output()}")
            time.sleep(0.02)
        self.kill()
        raise AssertionError(f"elastic-lighthouse did not listen within {timeout} s:\n{self.output()}")

    def address(self) -> str:
        return self._address

    @property
    def target(self) -> str:
        """host:port, for a gRPC channel."""
        return self._address.split("://", 1)[1]

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def shutdown(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGCONT)
            except OSError:
                pass
            self.process.kill()
            self.process.wait(10)


def lighthouse_server_shim(endpoints: str, workdir: Path, started: list[Lighthouse]) -> type:
    """A class with torchft's ``LighthouseServer(bind, min_replicas, join_timeout_ms, quorum_tick_ms,
    heartbeat_timeout_ms)`` signature that starts an ``elastic-lighthouse`` of a fresh id (torchft's
    tests expect each server to start empty). Unset timeouts take the Python class's defaults
    (join 100 ms, tick 100 ms, heartbeat 5000 ms), which are not the command line's."""

    class LighthouseServer(Lighthouse):
        def __init__(
            self,
            bind: str,
            min_replicas: int,
            join_timeout_ms: int | None = None,
            quorum_tick_ms: int | None = None,
            heartbeat_timeout_ms: int | None = None,
        ) -> None:
            args = ["--min_replicas", str(min_replicas)]
            for flag, value, default in (
                ("--join_timeout_ms", join_timeout_ms, 100),
                ("--quorum_tick_ms", quorum_tick_ms, 100),
                ("--heartbeat_timeout_ms", heartbeat_timeout_ms, 5000),
            ):
                args += [flag, str(default if value is None else value)]
            super().__init__(endpoints, f"torchft-{uuid.uuid4().hex[:8]}", workdir, *args, bind=bind)
            started.append(self)

    return LighthouseServer
