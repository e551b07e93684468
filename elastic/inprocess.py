"""``elastic.inprocess(train)``: a worker that survives its job's faults in the same process.

Under elastic-run, ``train(*args, **kwargs)`` is called in this process. When the job's round ends
(another rank's worker failed, a node was lost or joined, a hang was agreed on), the agent says
"stop" on this worker's control connection; a thread here then shuts down the TCP connections made
inside ``train`` and aborts every process group but a gloo one (so a collective blocked on a dead
peer returns: gloo's abort does not end a call in flight, the connections shut down do) and raises
``RoundInterrupted`` into the main
thread, out of ``train``. The process group is destroyed, the agent is told ("parked"), and once the next
round has formed it sends that round's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT, ...): ``os.environ`` is updated and ``train`` is called again. Whatever
``train`` keeps outside itself (a model, its compiled code, the CUDA context, data in memory) is
still there. A worker that does not come out of ``train`` within the agent's grace is killed and
started again, as without ``inprocess``.

``train`` sets up ``torch.distributed`` itself each time, as any script does. Outside elastic-run
(or with an agent that keeps no worker), ``inprocess`` calls ``train`` once and returns.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from launcher.inprocess import wire
from launcher.inprocess.wire import ENV

from .heartbeat import _reattach as _reattach_heartbeat

__all__ = ["inprocess", "RoundInterrupted", "ENV"]

PEER_WAIT = 5.0  # seconds an error in train waits for the agent to say the round ended elsewhere
T = TypeVar("T")


class RoundInterrupted(BaseException):
    """Raised into ``train`` when the job's round ends: not an error of this worker's.

    A BaseException, so that ``except Exception`` in training code does not swallow it."""


class _Control:
    """This worker's line-based connection to its agent, and the thread that acts on "stop"."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb", buffering=0)
        self._main = threading.main_thread().ident
        self._next: list[dict[str, str]] = []
        self._ready = threading.Condition()
        self.interrupted = threading.Event()
        self.in_train = False  # the main thread is inside train: the only place to interrupt it
        self.before: set[str] = set()  # the TCP connections this process had before train was called
        self._sock.sendall(wire.encode(wire.Hello(os.getpid())))
        threading.Thread(target=self._listen, name="elastic-inprocess", daemon=True).start()

    def _listen(self) -> None:
        for raw in self._file:
            message = wire.to_worker(raw)
            if isinstance(message, wire.Stop) and not self.interrupted.is_set():
                self.interrupted.set()
                _shut_connections(keep=self.before)  # first: an abort may wait on a peer or the store
                threading.Thread(target=_abort_groups, name="elastic-abort", daemon=True).start()
                if self.in_train:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self._main), ctypes.py_object(RoundInterrupted)
                    )
            elif isinstance(message, wire.Go):
                with self._ready:
                    self._next.append(message.env)
                    self._ready.notify()
        with self._ready:  # the agent is gone: so is the job, for this process
            self._next.append({})
            self._ready.notify()

    def parked(self) -> dict[str, str]:
        """Say the worker left ``train``; the next round's environment once the agent sends it."""
        self._sock.sendall(wire.encode(wire.Parked()))
        with self._ready:
            while not self._next:
                self._ready.wait()
            env = self._next.pop(0)
        if not env:
            raise SystemExit(1)
        self.interrupted.clear()
        return env


def _abort_groups() -> None:
    """Abort every process group (a collective blocked on a dead or stopped peer returns). Not a
    gloo one: its abort does not end a call in flight (the connections shut down do), and with a
    frozen peer it could block this thread inside torch while it holds the interpreter, so that the
    worker never leaves ``train`` (seen: 1 run in 4 of tests/torch/test_inprocess.py's frozen case)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":
            return
    except Exception:  # noqa: BLE001 -- no default group: nothing to abort
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001 -- the group is torn down after train returns anyway
        pass


def _connections() -> dict[str, int]:
    """This process's sockets: inode -> a descriptor of it (Linux's /proc; none elsewhere)."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found[target] = int(name)
    return found


def _shut_connections(keep: set[str]) -> None:
    """Shut down the TCP connections made since ``keep`` was taken (inside ``train``: the process
    group's), so that a gloo call blocked on a frozen or unreachable peer returns at once."""
    for inode, fd in _connections().items():
        if inode in keep:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                sock.getpeername()  # connected (a listening socket raises here and is left alone)
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()


def _tear_down() -> None:
    """The process group goes before ``train`` is called again: it belongs to the round that ended.
    An ``init_process_group`` the round's end interrupted (in its rendezvous: the store of a round
    gone) had counted its group already, and the next one would be named "1" where a new process's
    is "0": the ranks' gloo keys would never meet. The count goes back to 0, as destroying the
    group sets it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 -- aborted already: its objects are released either way
            pass
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and not dist.is_initialized() and hasattr(world, "group_count"):
        world.group_count = 0


def inprocess(train: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``train(*args, **kwargs)``, again in this process after each fault of the job (see the module)."""
    path = os.environ.get(ENV)
    if not path:
        return train(*args, **kwargs)
    control = _Control(path)
    while True:
        try:
            control.before = set(_connections())
            control.in_train = True
            result = train(*args, **kwargs)
            control.in_train = False
            if not control.interrupted.is_set():
                return result
        except RoundInterrupted:
            control.in_train = False
        except Exception:
            control.in_train = False
            # a collective broken by a dead peer raises before the agent says the round ended: wait
            # for that word a while; without it, the error is this worker's own (it exits with it)
            if not control.interrupted.wait(PEER_WAIT):
                raise
        except BaseException:  # SystemExit (the agent's SIGTERM), KeyboardInterrupt: as without inprocess
            control.in_train = False
            raise
        try:
            _tear_down()
            env = control.parked()
        except RoundInterrupted:  # the exception arrived late, outside train: it changes nothing
            _tear_down()
            env = control.parked()
        os.environ.update(env)
        _reattach_heartbeat()  # the new round's record
