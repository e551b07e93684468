"""The signals that stop an agent (torchrun's ``--signals-to-handle``): each becomes ``AgentStopped``
in the main thread, once; the agent then ignores them while it stops its workers with the same
signal."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import AgentStopped, UsageError

__all__ = [
    "parse_signals",
    "STOP_SIGNALS",
    "PASSED_SIGNALS",
    "stop_on_signals",
    "stop_deferred",
    "ignore_stop_signals",
    "pass_to_workers",
    "stop_requested",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # torchrun's --signals-to-handle
PASSED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # "checkpoint now" (SLURM's --signal=USR1@N): to the workers
_POLL = 0.1  # seconds between two looks at whether a stop was asked


class _Handled:
    """The signals the process turns into AgentStopped now."""

    def __init__(self) -> None:
        self.signals: tuple[int, ...] = STOP_SIGNALS
        self.deferring = False  # inside stop_deferred: a stop is kept for its end
        self.deferred: int | None = None  # the stop signal that came while deferring


_handled = _Handled()


def ignore_stop_signals() -> None:
    """From now on the stop signals are ignored (the agent is already stopping)."""
    if threading.current_thread() is threading.main_thread():
        for signum in _handled.signals:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def _handling(
    signals: tuple[int, ...], handle: Callable[[int, object], None], ignore_after: Callable[[], bool] = lambda: False
) -> Iterator[None]:
    """``handle`` for each of ``signals`` for the duration of the block, in the main thread only (a
    launch from a library's worker thread leaves signals to its caller: nothing changes); after it,
    the previous handlers again, or SIG_IGN when ``ignore_after()``."""
    if threading.current_thread() is not threading.main_thread() or not signals:
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signals}
    for signum in signals:
        signal.signal(signum, handle)
    try:
        yield
    finally:
        ignore = ignore_after()
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if ignore else handler)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Turn each of ``signals`` into AgentStopped in the main thread (once). A signal that finds the
    main thread at the edge of a lock (``_in_lock_code``) comes again 0.5 ms later,
    sent by a thread of its own (the handler takes no lock and starts no thread: a pipe wakes it)."""
    again = _Again() if threading.current_thread() is threading.main_thread() and signals else None

    def handle(signum: int, frame: object) -> None:
        if _handled.deferring:
            _handled.deferred = _handled.deferred or signum
            return
        if again is not None and _in_lock_code(frame):
            again.later(signum)
            return
        ignore_stop_signals()
        raise AgentStopped(signum)

    if threading.current_thread() is threading.main_thread():
        _handled.signals = tuple(signals)
    with _handling(signals, handle):
        try:
            yield
        finally:
            if again is not None:
                again.close()  # before the handlers go back: nothing comes again after the block


class _Again:
    """Sends a signal to this process again, shortly, from a thread of its own."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self._open = True
        threading.Thread(target=self._serve, name="stop-again", daemon=True).start()

    def later(self, signum: int) -> None:
        """From a signal handler: no lock, only a write to a pipe."""
        if self._open:
            os.write(self._write, bytes([signum]))

    def close(self) -> None:
        if self._open:
            self._open = False
            os.close(self._write)  # the thread reads the end and closes its side

    def _serve(self) -> None:
        while data := os.read(self._read, 1):
            time.sleep(0.0005)
            if self._open:
                os.kill(os.getpid(), data[0])
        os.close(self._read)


def _in_lock_code(frame: object) -> bool:
    """Whether the main thread was interrupted in a lock's ``__enter__`` or ``__exit__`` (the standard
    library's ``Condition``, which queues and events are built on): an exception raised there, after
    the lock was acquired and before the ``with`` took it (or before it was released), leaves the
    lock held for ever -- a queue's was, found deadlocked in a stopped agent's close-down. Anywhere
    else, a blocking wait included, the exception unwinds through ``with`` and ``finally`` as usual."""
    while frame is not None and frame.f_code.co_filename == __file__:  # a handler run again, inside itself
        frame = frame.f_back
    code = getattr(frame, "f_code", None)
    return code is not None and os.path.basename(code.co_filename) == "threading.py" and code.co_name in _EDGES


_EDGES = ("__enter__", "__exit__")


@contextmanager
def stop_deferred() -> Iterator[None]:
    """A stop signal that comes inside the block is raised as AgentStopped when the block ends, not
    in the middle of it: a worker started in it is always one its group knows, so it is stopped with
    the others (an exception between its fork and its registration left it to die unwarned with the
    agent). Main thread only; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread() or _handled.deferring:
        yield
        return
    _handled.deferring = True
    try:
        yield
    finally:
        _handled.deferring = False
        signum, _handled.deferred = _handled.deferred, None
        if signum is not None:
            ignore_stop_signals()
            raise AgentStopped(signum)


@contextmanager
def pass_to_workers(
    signals: tuple[int, ...], pids: Callable[[], list[int]], say: Callable[[str], None]
) -> Iterator[None]:
    """Pass each of ``signals`` on to the workers (each worker process, not its children, which
    may not expect it) and go on."""

    def handle(signum: int, frame: object) -> None:
        sent = 0
        for pid in pids():
            try:
                os.kill(pid, signum)
                sent += 1
            except ProcessLookupError:
                continue
        say(f"{signal.Signals(signum).name}: passed to {sent} worker{'s' if sent != 1 else ''}")

    with _handling(signals, handle):
        yield


@contextmanager
def stop_requested(
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[Callable[[float], bool]]:
    """For a server's main thread: ``stopped(seconds)`` sleeps up to ``seconds`` and says whether one
    of ``signals`` came (in another thread it only sleeps). The handler only appends to a list: one
    that took a lock (``Event.set``) deadlocked the main thread when the signal came while that
    thread held the lock itself, in the Event's own wait or in a first handler (a burst of SIGTERMs).
    Once a stop was asked, leaving the block ignores these signals: the exit is not cut short."""
    asked: list[int] = []

    def stopped(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not asked and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(_POLL, left))
        return bool(asked)

    with _handling(signals, lambda signum, frame: asked.append(signum), ignore_after=lambda: bool(asked)):
        yield stopped


def parse_signals(text: str) -> tuple[int, ...]:
    """``--signals-to-handle``: signal names, comma-separated (``SIGTERM,SIGUSR1``), that stop the job
    gracefully. Each must exist and be catchable."""
    found = []
    for name in (part.strip() for part in str(text).split(",")):
        number = getattr(signal, name, None) if name.startswith("SIG") and not name.startswith("SIG_") else None
        if not isinstance(number, signal.Signals) or number in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(
                f"--signals-to-handle {text!r}: {name!r} is not a signal that can be handled (e.g. SIGTERM,SIGUSR1)"
            )
        if number not in found:
            found.append(number)
    return tuple(found)
