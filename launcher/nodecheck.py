"""The health gate: before a node takes a rank -- its first round, and after its own workers failed
-- it checks itself. A node that fails a check takes no rank: it steps out of the job's rounds (its
round's failures are then a membership change, no restart used; a hot spare can take its place),
says why in one line, records it in the job's history and its metrics, and checks again on a
back-off until every check passes, then joins as any newcomer does.

The checks, each a reason in one line when it fails (None: healthy):

- the directories the job writes (the log directory, ``--checkpoint-dir``) can be made, written,
  and have ``MIN_FREE_BYTES`` free;
- on a node with NVIDIA devices (``/dev/nvidia0``), ``gpuprobe.py`` in a child interpreter (the
  agent never imports NVML or torch), within ``GPU_TIMEOUT`` seconds: NVML's counters where
  ``pynvml`` is installed (a device lost, a recovery action asked for, uncorrected ECC errors,
  remapped rows or retired pages waiting for a reset), then a matmul on every visible device -- but
  after the node's own workers failed, while the job waits, the counters alone where NVML answers;
- ``--health-check CMD``: run by the shell with the workers' environment; exit 0 is healthy, else
  the last line it printed is the reason; at most ``CMD_TIMEOUT`` seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from rendezvous.errors import RendezvousClosedError, RendezvousError, RendezvousTimeoutError
from rendezvous.job.history import Kind
from rendezvous.job.state import JobStatus

__all__ = [
    "NodeChecks",
    "Started",
    "HealthGate",
    "MIN_FREE_BYTES",
    "CMD_TIMEOUT",
    "GPU_TIMEOUT",
    "backoff",
    "reason_of",
    "check_dirs",
]

MIN_FREE_BYTES = 64 << 20  # free space a directory the job writes must have
CMD_TIMEOUT = 60.0  # seconds --health-check may take
GPU_TIMEOUT = 60.0  # seconds every device has for its matmul
BACKOFF = (5.0, 10.0, 20.0, 40.0, 60.0)  # seconds between the checks of an unhealthy node

_GPU_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpuprobe.py")  # run by path


def backoff(attempt: int) -> float:
    """Seconds before the check after ``attempt`` failed ones (0-based)."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def reason_of(what: str, returncode: int, output: str) -> str:
    """A failed check's reason: the last line it printed, else its exit code."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = lines[-1][:300] if lines else f"exit code {returncode}"
    return f"{what} failed: {said}"


def check_dirs(paths: Sequence[str], min_free: int = MIN_FREE_BYTES) -> str | None:
    """Each directory can be made and written, with ``min_free`` bytes free."""
    for path in paths:
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".elastic-check-"):
                pass
            free = shutil.disk_usage(path).free
        except OSError as exc:
            return f"{path} cannot be written ({exc.strerror or exc})"
        if free < min_free:
            return f"{path} has {free >> 20} MiB free (at least {min_free >> 20} MiB needed)"
    return None


@dataclass(frozen=True)
class NodeChecks:
    """What this node checks before it takes a rank."""

    dirs: tuple[str, ...] = ()  # directories the job writes
    command: str = ""  # --health-check ("": none)
    gpus: bool = False  # the node has NVIDIA devices to try

    def for_node(self, dirs: Sequence[str]) -> "NodeChecks":
        """These checks on this node: the directories the job writes, and its GPUs when it has any."""
        return replace(self, dirs=tuple(d for d in dirs if d), gpus=os.path.exists("/dev/nvidia0"))

    def run(
        self, environ: Mapping[str, str], *, after_failure: bool = False, started: Started | None = None
    ) -> str | None:
        """The first failing check's reason (None: every check passed). ``after_failure``: this node's
        workers just failed, and the job waits for this check: the GPUs' NVML counters alone where
        NVML answers (a tenth of a second; the matmul costs a CUDA context and torch's import).
        ``started``: that GPU check, begun earlier by ``start_gpus``: its answer is awaited here."""
        if started is not None:  # running already: its answer first, whatever the others say
            gpus = started.reason()
            return check_dirs(self.dirs) or gpus or self._command(environ)
        return check_dirs(self.dirs) or self._gpus(environ, after_failure) or self._command(environ)

    def start_gpus(self, environ: Mapping[str, str], counters_only: bool = True) -> Started | None:
        """The GPU check, started now in a child process (None: no GPU to check); by default the one
        after a failure, which the agent starts as its round ends, while the workers stop. The
        directories and --health-check wait for the workers' end: a command may look at what they held."""
        if not self.gpus:
            return None
        argv = [sys.executable, _GPU_PROBE, *(["--counters"] if counters_only else [])]
        return Started(argv, environ, GPU_TIMEOUT, "the GPU check")

    def _command(self, environ: Mapping[str, str]) -> str | None:
        if not self.command:
            return None
        return _run(["/bin/sh", "-c", self.command], environ, CMD_TIMEOUT, "--health-check")

    def _gpus(self, environ: Mapping[str, str], counters_only: bool) -> str | None:
        started = self.start_gpus(environ, counters_only)
        return started.reason() if started is not None else None


def _run(argv: list[str], environ: Mapping[str, str], timeout: float, what: str) -> str | None:
    return Started(argv, environ, timeout, what).reason()


class Started:
    """A check running in a child process (its own session), from its start to its reason."""

    def __init__(self, argv: list[str], environ: Mapping[str, str], timeout: float, what: str) -> None:
        self.what, self._deadline = what, time.monotonic() + timeout
        self._timeout, self._failed = timeout, None
        try:
            self._process: subprocess.Popen | None = subprocess.Popen(
                argv,
                env=dict(environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._process, self._failed = None, f"{what} could not start ({exc.strerror or exc})"

    def reason(self) -> str | None:
        """Wait for it (until its timeout, counted from its start): why it failed, or None."""
        if self._process is None:
            return self._failed
        try:
            output, _ = self._process.communicate(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.drop()
            return f"{self.what} did not end within {self._timeout:g} s"
        if self._process.returncode == 0:
            return None
        return reason_of(self.what, self._process.returncode, output.decode("utf-8", "replace"))

    def drop(self) -> None:
        """No answer needed any more: the child's process group is killed, the child reaped."""
        if self._process is None:
            return
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)  # its own session: what it started too
            except ProcessLookupError:
                pass
        self._process.wait()
        self._process.stdout.close()


class HealthGate:
    """The agent's side of the gate: when to check, what to say and record, and the wait until the
    checks pass. ``step_out(reason)`` leaves the job's rounds; ``closed()`` raises when the job
    closed meanwhile (this node has nothing left to wait for), else says whether the job exists (its
    history can take a record)."""

    def __init__(
        self,
        checks: NodeChecks,
        environ: Mapping[str, str],
        *,
        say: Callable[[str], None],
        record: Callable[..., None],
        step_out: Callable[[str], None],
        closed: Callable[[], bool],
        healthy: Callable[[bool], None],
        sleep: Callable[[float], None] = time.sleep,
        patience: float | None = None,
    ) -> None:
        """``patience``: seconds an unhealthy node waits for its checks to pass before it gives up
        (RendezvousTimeoutError: exit 200, worth a retry elsewhere; None: it waits as long as it takes)."""
        self._checks, self._environ = checks, environ
        self._say, self._record, self._step_out, self._closed, self._healthy = say, record, step_out, closed, healthy
        self._sleep, self._patience = sleep, patience
        self._reason: str | None = None  # why this node stepped out (None: it is in)
        self._checked = False  # the first round's check passed
        self._unrecorded: str | None = None  # a reason said but not yet in the job's history (no job yet)
        self._ahead: Started | None = None  # the check after a failure, started as the round ended

    @classmethod
    def for_agent(cls, checks, environ, say, record, handler, telemetry, patience: float) -> "HealthGate":
        """The gate of an agent: it steps out through ``handler`` and says so in ``telemetry``;
        ``patience``: the job's join timeout."""

        def closed() -> bool:
            try:
                state = handler.job_state()
            except RendezvousError:
                return False  # etcd away: the next look
            if state is not None and state.status is JobStatus.CLOSED:
                exc = RendezvousClosedError(f"the job closed while this node was unhealthy ({state.reason})")
                exc.while_waiting = True
                raise exc
            return state is not None

        return cls(
            checks,
            environ,
            say=say,
            record=record,
            step_out=handler.step_out,
            closed=closed,
            healthy=telemetry.healthy,
            patience=patience,
        )

    def round_failing(self) -> None:
        """This node's round ends on a failure or a hang: the GPU check that may follow (``after_failure``)
        starts now, while the workers stop. Dropped unless ``after_failure`` follows before the next
        round (another node's worker failed, or a peer was lost: no check)."""
        self._drop_ahead()
        self._ahead = self._checks.start_gpus(self._environ)

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead.drop()
        self._ahead = None

    def close(self) -> None:
        """The agent ends: a check still running is not waited for."""
        self._drop_ahead()

    def after_failure(self, what: str) -> bool:
        """This node's workers failed (``what``): True when its checks fail too and it stepped out
        (the failure uses no restart), False to restart as usual."""
        started, self._ahead = self._ahead, None
        reason = self._checks.run(self._environ, after_failure=True, started=started)
        if reason is not None:
            self._out(reason, f"{what}; ")
        return reason is not None

    def before_round(self, last_round: int = 0) -> None:
        """Return once this node may take a rank: at once, or when its checks pass again (its records
        name ``last_round``, the round this node took part in last; 0: none yet)."""
        self._drop_ahead()
        if self._checked and self._reason is None:
            return
        if self._reason is None:
            reason = self._checks.run(self._environ)
            if reason is not None:
                self._out(reason, "")
        attempt, waited = 0, 0.0
        while self._reason is not None:
            if self._closed() and self._unrecorded is not None:
                self._record(Kind.NODE_UNHEALTHY, last_round, reason=self._unrecorded)
                self._unrecorded = None
            if self._patience is not None and waited >= self._patience:
                raise RendezvousTimeoutError(
                    f"this node stayed unhealthy for {waited:g} s (join timeout {self._patience:g} s): {self._reason}"
                )
            pause = backoff(attempt) if self._patience is None else min(backoff(attempt), self._patience - waited)
            self._sleep(pause)
            attempt, waited = attempt + 1, waited + pause
            reason = self._checks.run(self._environ)
            if reason is None:
                self._say("this node's health checks pass again: it joins the job's next round")
                self._record(Kind.NODE_HEALTHY, last_round)
                self._healthy(True)
            elif reason != self._reason:
                self._say(f"this node is still unhealthy: {reason}")
                self._unrecorded = reason
            self._reason = reason
        self._checked = True

    def _out(self, reason: str, prefix: str) -> None:
        self._say(
            f"{prefix}this node is unhealthy: {reason}; it takes no rank (no restart used) and checks again "
            f"in {backoff(0):g} s"
        )
        self._unrecorded = reason  # recorded once the job exists
        self._healthy(False)
        self._step_out(reason)
        self._reason = reason
