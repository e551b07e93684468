"""Warm starts: the agent keeps one pre-started interpreter (``launcher.warmstart.zygote``) that has
imported what its workers will import, and forks each Python worker from it -- at the first start
and at every restart -- instead of starting a fresh interpreter that loads torch again.

``WarmStarter`` starts that interpreter when the agent starts, so that its imports overlap the
rendezvous; a worker to start before they are done waits for them (a fresh one would spend longer
on the same imports). ``spawn`` returns a ``WarmProcess``: the worker's pid, and its end as
``subprocess.Popen`` reports it (``poll``, ``wait``, negative for a signal), relayed by the
interpreter, whose child the worker is. A command that is not ``python -u SCRIPT|-m MODULE|-c CODE
...`` of this Python, or a wrapped one (--numa-binding), is started plainly (``warm_able``). The
interpreter dies with the agent (a parent-death signal), and its workers with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from launcher import envnames
from rendezvous.processes import die_with_parent

from . import wire
from .priority import SPARE_NICE, may_raise, renice


class WarmSettings(Protocol):
    """What ``warm_starter`` reads of the agent's settings (``launcher.config.AgentConfig``)."""

    warm_start: bool
    argv: Sequence[str]
    cpu_binding: Mapping[int, tuple[str, ...]]
    preload: Sequence[str]
    nproc_per_node: int


__all__ = [
    "WarmStarter",
    "WarmProcess",
    "default_preload",
    "early_warm_starter",
    "preload_for",
    "warm_able",
    "warm_starter",
]

READY_WITHIN = 120.0  # seconds a worker start waits for the warm interpreter's imports, then starts plainly

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")


_KNOWN = {"torch": ("torch", "torch._dynamo"), "numpy": ("numpy", "numpy.random")}  # safe to import before the fork


def default_preload(argv: Sequence[str]) -> tuple[str, ...]:
    """What the warm interpreter imports unless told more: torch and what torch imports on first
    use (its optimizers load torch._dynamo), and numpy, each when installed and imported by the
    worker's program (its script, or its module's file; read, not run). A user's own modules are
    imported only when named (--preload): importing them may do anything."""
    from importlib.util import find_spec

    return preload_for(top for top in _imports(_program_file(argv)) if top in _KNOWN and find_spec(top) is not None)


def preload_for(packages: Iterable[str]) -> tuple[str, ...]:
    """The modules to preload for workers that import ``packages`` (torch's and numpy's known parts)."""
    named = set(packages)
    return tuple(module for top, modules in _KNOWN.items() if top in named for module in modules)


def _program_file(argv: Sequence[str]) -> str | None:
    """The file of ``python -u SCRIPT|-m MODULE|-c CODE SCRIPT`` (--run-path's form) ..."""
    from importlib.util import find_spec

    rest = list(argv[2:])
    if rest and rest[0] == "-m" and len(rest) > 1:
        try:
            spec = find_spec(rest[1])
        except (ImportError, ValueError):
            return None
        return spec.origin if spec is not None else None
    if rest and rest[0] == "-c":
        return rest[2] if len(rest) > 2 else None
    return rest[0] if rest else None


_USES_TORCH = {"checkpoint"}  # parts of this project's ``elastic`` that load torch when called


def _imports(path: str | None) -> set[str]:
    """The top-level package of every import statement in ``path``'s source (none if unreadable);
    "torch" too where it uses ``elastic.checkpoint``, which saves and loads with torch."""
    import ast

    try:
        with open(path or "", "rb") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        if _uses_torch_of_elastic(node):
            names.add("torch")
    return names


def _uses_torch_of_elastic(node) -> bool:
    """``elastic.checkpoint`` (an attribute or ``import elastic.checkpoint``) or ``from elastic import checkpoint``."""
    import ast

    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "elastic" and node.attr in _USES_TORCH
    if isinstance(node, ast.Import):
        return any(
            alias.name.startswith("elastic.") and alias.name.split(".")[1] in _USES_TORCH for alias in node.names
        )
    if isinstance(node, ast.ImportFrom) and node.module == "elastic" and not node.level:
        return any(alias.name in _USES_TORCH for alias in node.names)
    return False


class WarmProcess:
    """A worker forked by the warm interpreter, seen as ``subprocess.Popen`` sees its children."""

    def __init__(self, pid: int, starter: "WarmStarter", argv: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(argv)
        self._starter = starter
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._starter.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._starter.wait_for_exit(min(left, 0.5) if left is not None else 0.5)
        return self.returncode


class WarmStarter:
    """The warm interpreter of one agent, and the workers forked from it."""

    def __init__(self, preload: Sequence[str], environ: Mapping[str, str], say: Callable[[str], None]) -> None:
        self.preload = tuple(preload)
        self._environ = dict(environ)
        self._say = say
        self._changes = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[wire.Forked] = []
        self._ready: wire.Ready | None = None
        self._dead = False
        self._said = False
        self._lowered = False  # its imports run at SPARE_NICE (``background``)
        self._log = tempfile.TemporaryFile()  # its own errors, for the line that says why it is off
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        argv = die_with_parent([sys.executable, "-u", ZYGOTE, str(theirs.fileno()), ",".join(self.preload)])
        self._process = subprocess.Popen(
            argv,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )
        theirs.close()
        self._reader = threading.Thread(target=self._read, name="warm-start", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def started_for(self, preload: Sequence[str], environ: Mapping[str, str]) -> bool:
        """Whether it imports ``preload`` in ``environ``, but for the launcher's own TORCHELASTIC_*
        variables: set for the workers, each of which gets its whole environment at its fork."""
        ours = {k: v for k, v in self._environ.items() if not k.startswith(envnames.PREFIX)}
        theirs = {k: v for k, v in environ.items() if not k.startswith(envnames.PREFIX)}
        return self.preload == tuple(preload) and ours == theirs

    def adopt(self, say: Callable[[str], None]) -> None:
        """An agent takes over an interpreter started before it (``launcher.cli.early``)."""
        self._say = say

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            with self._changes:
                if not data:
                    self._dead = True
                else:
                    message = wire.to_agent(data)
                    if isinstance(message, wire.Exited):
                        self._exits[message.pid] = os.waitstatus_to_exitcode(message.status)
                    elif isinstance(message, wire.Ready):
                        self._ready = message
                    elif isinstance(message, wire.Forked):
                        self._replies.append(message)
                self._changes.notify_all()
            if not data:
                return

    def can_start(self) -> bool:
        """Whether a worker is forked warm (the agent starts this only for warm-able workers, see
        ``warm_able``). Waits for the interpreter's imports while they run: a fresh worker would spend
        longer on the same imports. A reason it will not do is said once."""
        self.foreground()
        with self._changes:
            self._changes.wait_for(lambda: self._ready is not None or self._dead, timeout=READY_WITHIN)
            why = self._broken()
        if why and not self._said:
            self._said = True
            self._say(f"warm start off: {why}; workers start as fresh processes")
        elif not why and not self._said and self._ready.failed:
            self._said = True
            failed = "; ".join(f"{name} ({error})" for name, error in self._ready.failed.items())
            self._say(f"warm start: could not import {failed}; the workers import it themselves")
        return not why

    def _broken(self) -> str:
        if self._dead or self._process.poll() is not None:  # exited: its reader may not have seen EOF yet
            return f"the warm interpreter exited ({self._last_line() or 'no output'})"
        if self._ready is None:
            return f"the warm interpreter's imports took more than {READY_WITHIN:.0f} s"
        return self._ready.unsafe

    def _last_line(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def background(self) -> None:
        """This node waits as a hot spare: the imports, while they still run, at the lowest CPU
        priority, so that on a machine it shares they never slow the nodes that train. Only the
        importing thread is lowered (``zygote._preload_aside``): the workers are forked from the
        interpreter's main thread, at its own priority. Set from here, and said on the wire for an
        importing thread not started yet (``_prioritize``)."""
        self._lowered = self._prioritize(SPARE_NICE) or self._lowered

    def foreground(self) -> None:
        """Workers to start (``can_start``): imports still running go back to the interpreter's own
        priority -- where the system lets this process raise a priority again (root, CAP_SYS_NICE);
        elsewhere they finish at the low one."""
        if self._lowered:
            self._lowered = False
            nice = os.getpriority(os.PRIO_PROCESS, 0)  # this process's, which it was started at
            if not self._prioritize(nice):  # the imports ended lowered: its group, which forks the workers, too
                renice(self._process.pid, nice)

    def _prioritize(self, nice: int) -> bool:
        """The imports at ``nice`` (the interpreter's importing thread only), if they still run: set
        from here at once, and said on the wire for a thread not started yet. From here, because the
        interpreter's main thread cannot take the message while the lowered importing thread holds
        the GIL and gets no CPU: under load a spare called into a round, or a node whose interpreter
        started early, waited 50 s for its imports to go on."""
        with self._changes:
            if self._ready is not None or self._dead:
                return False
            renice(self._process.pid, nice)
            try:
                self._sock.send(wire.encode(wire.Priority(nice)))
            except OSError:  # the interpreter is gone: its reader says so
                return False
            return True

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], stdout: int, stderr: int) -> WarmProcess:
        """Fork a worker running ``argv`` with ``env`` and these two descriptors (not closed here)."""
        request = wire.encode(wire.Request(list(argv), dict(env), os.getcwd()))
        with self._changes:
            socket.send_fds(self._sock, [request], [stdout, stderr])
            self._changes.wait_for(lambda: self._replies or self._dead, timeout=30)
            if not self._replies:
                raise OSError("the warm interpreter did not fork the worker")
            reply = self._replies.pop(0)
        return WarmProcess(reply.pid, self, argv)

    def returncode(self, pid: int) -> int | None:
        with self._changes:
            if pid in self._exits:
                return self._exits[pid]
            if self._dead and not _alive(pid):
                return -signal.SIGKILL  # its interpreter died: the parent-death signal killed it
            return None

    def wait_for_exit(self, timeout: float) -> None:
        with self._changes:
            self._changes.wait(timeout)

    def close(self) -> None:
        """Stop the interpreter (the workers forked from it are stopped already, or die with it)."""
        self._process.kill()  # it may be importing still: no reason to wait for that
        self._process.wait()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # the reader's recv ends (it owns no descriptor)
        except OSError:
            pass  # the interpreter's end is gone already
        self._reader.join(timeout=2.0)
        self._sock.close()
        self._log.close()


def warm_able(argv: Sequence[str], wrapped: bool) -> bool:
    """Whether workers running ``argv`` can be forked warm at all: ``python -u`` of this interpreter
    with a script, ``-m MODULE`` or ``-c CODE`` (--run-path), and no command in front (--numa-binding)."""
    if wrapped or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-u":
        return False
    if argv[2] in ("-m", "-c"):
        return len(argv) >= 4
    return not argv[2].startswith("-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def warm_starter(
    config: WarmSettings, environ: Mapping[str, str], say: Callable[[str], None], early: WarmStarter | None = None
) -> WarmStarter | None:
    """The warm interpreter an agent's workers are forked from, started now so that its imports
    overlap the rendezvous (None: --no-warm-start, workers that are not Python programs, or nothing
    to preload: neither torch nor numpy imported by the program, nor --preload). ``early``: one the
    command started before the agent existed, adopted when it imports the same in the same
    environment, else stopped."""
    wanted = None
    if config.warm_start and warm_able(config.argv, wrapped=bool(config.cpu_binding)):
        wanted = _wanted(config.argv, config.preload, config.nproc_per_node > 1, environ)
    if early is not None:
        if wanted is not None and early.started_for(*wanted):
            early.adopt(say)
            return early
        early.close()
    return WarmStarter(*wanted, say) if wanted is not None else None


def early_warm_starter(
    argv: Sequence[str], preload: Sequence[str], many: bool, environ: Mapping[str, str]
) -> WarmStarter | None:
    """The interpreter for workers running ``argv``, started before the agent (``launcher.cli.early``;
    ``many``: more than one worker a node). Silent until an agent adopts it. Its imports run at the
    lowest priority until the agent starts workers (``can_start``): on a machine of its own that
    costs nothing, and where agents share one (a spare beside the nodes that train, a test) the
    agents' own start and the rendezvous come first, as when the interpreter started after them.
    Only where this process may raise them again (``priority.may_raise``): elsewhere (not root, or
    root in a container without CAP_SYS_NICE) the node's first workers would wait on imports left at
    the lowest priority, and they run at the interpreter's own from the start."""
    wanted = _wanted(argv, preload, many, environ) if warm_able(argv, wrapped=False) else None
    if wanted is None:
        return None
    starter = WarmStarter(*wanted, lambda line: None)
    if may_raise():
        starter.background()
    return starter


def _wanted(
    argv: Sequence[str], preload: Sequence[str], many: bool, environ: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """What the interpreter imports and the environment it runs in (None: nothing heavy to spare, a
    fresh interpreter starts in a few ms)."""
    modules = (*default_preload(argv), *preload)
    if not modules:
        return None
    environ = dict(environ)
    if many:
        environ.setdefault("OMP_NUM_THREADS", "1")  # what the workers get: libraries read it at import
    return modules, environ
