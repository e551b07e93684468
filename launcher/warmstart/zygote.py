"""The warm interpreter an agent forks its Python workers from (``launcher.warmstart.interpreter`` drives it).

Run by path (``python -u zygote.py FD MODULES``) so that nothing of the project is imported here
but its wire and what a worker runs (``wire.py``, ``program.py``, loaded by their paths: the
standard library only): it imports MODULES (torch and the parts torch imports on first use, and any
the user names), says whether it can fork safely (Ready), then serves one request at a time on the
SOCK_SEQPACKET socket FD: a Request (with the worker's stdout and stderr as two descriptors) is
answered with the forked worker's pid (Forked), and each worker's end is told as it comes (Exited).

A forked worker becomes what a plain start makes: a session of its own, SIGKILL when this process
dies (which dies with the agent), stdin on /dev/null, its stdout and stderr, the agent's cwd, its
environment, default signal handlers, reseeded generators (numpy's global one and torch's; Python's
``random`` reseeds itself), the import-time output of the modules it was spared, and then its
program as ``python -u`` runs it (``program.run``): ``SCRIPT``, ``-m MODULE`` or ``-c CODE``, with
its argv, sys.path and ``__main__``, and named as it (``/proc/PID/cmdline``, with setproctitle). It
exits as that program does (an uncaught exception: its traceback and exit 1), through the
interpreter's own exit steps but not its teardown, which in a forked child can wait forever.

Nothing here may leave a thread at work, initialize an accelerator or run a tensor operation: a fork
copies only the thread that forks, and CUDA cannot be used in a child forked after it was initialized
(the imports run on a thread of their own, idle from their end on: ``_preload_aside``).
"""

import ctypes
import errno
import gc
import importlib.util
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time

__all__ = ["die_with", "main", "serve"]

_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 20


def _load(name: str):
    """``NAME.py`` beside this file, by its path, as ``_elastic_warm_NAME`` (a name no program of the
    user's takes)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_elastic_warm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


wire = _load("wire")
program = _load("program")  # what a forked worker runs

try:  # names this interpreter (a C extension: imported before any fork)
    import setproctitle as _setproctitle
except ImportError:  # it keeps its command line
    _setproctitle = None


def _preload(names: list[str]) -> tuple[list[str], dict[str, str], bytes, bytes]:
    """Import ``names``; what imported, what failed (and why), and what they printed (stdout, stderr).

    The collector is off while they import and stays off here; what this process made is frozen
    before each fork (``serve``) and each forked worker turns the collector on: CPython's own recipe
    for a process that forks without exec. The imports take a fifth less CPU (torch's makes objects
    by the million, and each collection walked them all), and a worker's collections never touch
    the interpreter's objects -- their pages stay shared with it, and its collections stay short."""
    gc.disable()
    loaded, failed = [], {}
    captured = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    saved = [os.dup(1), os.dup(2)]
    for fd, file in zip((1, 2), captured):
        os.dup2(file.fileno(), fd)
    try:
        for name in names:
            try:
                __import__(name)
                loaded.append(name)
            except Exception as exc:  # noqa: BLE001 -- any import error: the workers import it themselves
                failed[name] = f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
    output = []
    for file in captured:
        file.seek(0)
        output.append(file.read())
        file.close()
    return loaded, failed, output[0], output[1]


def _preload_aside(names: list[str], sock: socket.socket) -> tuple[list[str], dict[str, str], bytes, bytes, int]:
    """``_preload`` on a thread of its own, while this (main) thread takes the agent's Priority
    messages for it: a hot spare's agent lowers the imports' CPU priority (Linux keeps one per
    thread), so that on a shared machine a spare's imports never slow the nodes that train -- and
    the workers, forked from this thread once the imports are done, start at this process's own.

    The importing thread never ends: it waits, idle, for good. A thread that ends runs the C
    library's thread-local destructors after ``Thread.join`` has returned, and so do the OpenMP
    threads it started (a preloaded module's tensor operation starts them), which end with it: MKL's
    destructor frees a thread's buffers under a spinlock, and a worker forked meanwhile inherits the
    lock held and spins on it forever in its first matrix multiply. Idle threads hold no lock.
    Last of what it returns: the importing thread's id (``_unsafe`` leaves it out)."""
    done: list[tuple[list[str], dict[str, str], bytes, bytes]] = []
    ended_r, ended_w = os.pipe()  # written when the imports end: the waits below wake at once
    idle = threading.Event()  # never set

    def imports() -> None:
        try:
            done.append(_preload(names))
        finally:
            os.write(ended_w, b"x")
            idle.wait()

    thread = threading.Thread(target=imports, name="elastic-preload", daemon=True)
    thread.start()
    while True:
        ready = select.select([sock, ended_r], [], [])[0]
        if ended_r in ready or not _take_priority(sock, thread.native_id):
            break  # the imports ended, or not a Priority (the agent is gone, or asks for a worker): ``serve``'s
    os.read(ended_r, 1)  # the imports' end, if a request came first
    _restore_group()
    os.close(ended_r)  # neither end may reach a forked worker
    os.close(ended_w)
    if not done:  # an import raised past Exception (SystemExit, KeyboardInterrupt)
        return [], dict.fromkeys(names, "the import ended its thread"), b"", b"", thread.native_id
    return (*done[0], thread.native_id)


def _take_priority(sock: socket.socket, thread: int) -> bool:
    """The agent's next message, if it is a Priority: given to ``thread``, and to this process's
    scheduling group where the kernel groups by session (autogroup: a nice value then weighs only
    against this session's threads; the workers, each a session of its own, start in a new group at
    the default weight). Anything else stays queued."""
    message = wire.to_interpreter(sock.recv(_MAX_MESSAGE, socket.MSG_PEEK))
    if not isinstance(message, wire.Priority):
        return False
    sock.recv(_MAX_MESSAGE)
    for give in (lambda: os.setpriority(os.PRIO_PROCESS, thread, message.nice), lambda: _group_nice(message.nice)):
        try:
            give()
        except OSError:  # a higher priority is not this process's to give (no CAP_SYS_NICE): left as it is
            pass
    return True


def _group_nice(nice: int) -> None:
    with open("/proc/self/autogroup", "w") as group:  # absent without autogroup; ignored in a cgroup
        group.write(str(nice))


def _restore_group() -> None:
    """The imports' end: a scheduling group a spare's agent lowered goes back to a new session's nice
    0. The low priority is the imports'; this process's main thread forks the workers, and each fork
    in a lowered group waited a second or more for a CPU on a loaded machine. The kernel lets an
    unprivileged process change a group once in 0.1 s (EAGAIN before): tried for up to a second."""
    if os.getsid(0) != os.getpid():  # not a session of its own: the group is not this process's
        return
    for _ in range(10):
        try:
            with open("/proc/self/autogroup") as group:
                if int(group.read().split()[-1]) == 0:
                    return
            _group_nice(0)
            return
        except (OSError, ValueError, IndexError) as exc:
            if getattr(exc, "errno", None) != errno.EAGAIN:
                return  # no autogroup here, or not this process's to change
            time.sleep(0.1)


def _unsafe(importer: int) -> str:
    """Why forking here would not give a sound worker ("" when it would)."""
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.native_id != importer]
    if others:
        return f"the preloaded modules started Python threads ({', '.join(others)})"
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        return "the preloaded modules initialized CUDA"
    return ""


def _send(sock: socket.socket, message) -> None:
    sock.send(wire.encode(message))


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, wire.Exited(pid, status))


def serve(sock: socket.socket, output: tuple[bytes, bytes]) -> None:
    """Fork a worker per request until the agent closes the socket; report each one's end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(sock)
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
            if not data:
                return  # the agent is gone; the workers die with this process
            request = wire.to_interpreter(data)
            if not isinstance(request, wire.Request) or len(fds) != 2:  # nothing to fork (a late Priority,
                # or not the agent's: it would wait, and say so)
                for fd in fds:
                    os.close(fd)
                continue
            gc.freeze()  # all this process made (the imports, this request): a worker collects only its own
            zygote = os.getpid()
            pid = os.fork()
            if pid == 0:
                die_with(zygote)
                _become_worker(request, fds, output, (sock.fileno(), wake_r, wake_w))
                program.run(request.argv)  # never returns
            for fd in fds:
                os.close(fd)
            _send(sock, wire.Forked(pid))


def die_with(zygote: int) -> None:
    """In the forked child, first: SIGKILL when this interpreter dies (it dies with its agent), and an
    exit now if it died already. ``zygote`` is its pid read before the fork: read in the child, the
    parent could already be init, and a worker forked as its agent was killed would run on alone."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != zygote:
        os._exit(128 + signal.SIGKILL)  # as a plain worker of a dead agent would end


def _become_worker(request, fds: list[int], output: tuple[bytes, bytes], ours: tuple[int, ...]) -> None:
    """In the forked child: everything a plain start would have given the worker."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (fds[0], 1), (fds[1], 2)):
        os.dup2(source, target)
    for fd in (null, *fds, *ours):
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    gc.enable()  # as in any interpreter; the warm interpreter's objects stay frozen (``_preload``)
    _reseed()
    for fd, text in zip((1, 2), output):
        if text:
            os.write(fd, text)


def _reseed() -> None:
    """What a fresh process seeds on its own: numpy's global generator and torch's (``random``
    reseeds itself in a forked child)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def main() -> None:
    sys.path.pop(0)  # run by path: this directory must not shadow the workers' imports
    sock = socket.socket(fileno=int(sys.argv[1]))
    loaded, failed, out, err, importer = _preload_aside([name for name in sys.argv[2].split(",") if name], sock)
    if _setproctitle is not None:  # its own name, and the room its workers' names take, set up now
        _setproctitle.setproctitle(f"elastic-run warm interpreter ({', '.join(loaded) or 'nothing preloaded'})")
    _send(sock, wire.Ready(loaded, failed, _unsafe(importer)))
    serve(sock, (out, err))


if __name__ == "__main__":
    main()
