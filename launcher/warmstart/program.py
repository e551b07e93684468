"""A forked worker becomes its program: ``run`` runs ``python -u``'s ``SCRIPT``, ``-m MODULE`` or ``-c
CODE`` with its argv, sys.path and ``__main__``, named as the plain start's command line, and ends
the process as the interpreter would -- its exit steps, not its teardown (``_exit``).

Loaded by its path by the warm interpreter (``zygote.py``), before any fork: the standard library
only, and setproctitle where it is installed.
"""

import ctypes
import gc
import os
import signal
import sys

__all__ = ["EXIT_GRACE", "run"]

_PR_SET_NAME = 15
EXIT_GRACE = 10.0  # seconds a forked worker's exit steps may take after its program ended

try:  # names a forked worker as its program (a C extension: imported before any fork)
    import setproctitle as _setproctitle
except ImportError:  # the workers keep the interpreter's command line
    _setproctitle = None


def run(argv: list[str]) -> None:
    """``argv[1:]`` as ``python -u`` runs it: ``-m MODULE args``, ``-c CODE args`` or ``SCRIPT args``;
    then the process ends as the interpreter would end it (see ``_exit``). Never returns."""
    code = _program(argv)
    os._exit(_exit(code))


def _program(argv: list[str]) -> int:
    """Run the program; its exit status as the interpreter computes it (SystemExit's code, 1 and a
    traceback for an uncaught exception)."""
    import runpy

    sys.orig_argv = list(argv)
    rest = argv[2:]  # after the interpreter and -u
    _name_as(argv)
    try:
        if rest[0] == "-m":
            sys.argv = [rest[1], *rest[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        elif rest[0] == "-c":
            sys.argv = ["-c", *rest[2:]]
            sys.path.insert(0, "")
            exec(compile(rest[1], "<string>", "exec"), _main_module().__dict__)
        else:
            sys.argv = list(rest)
            sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
            runpy.run_path(rest[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        _print_exception()
        _exit(1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as the interpreter ends on an uncaught Ctrl-C
        return 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 -- the program's own error: shown and exit 1, as python does
        _print_exception()
        return 1
    return 0


def _exit_status(code: object) -> int:
    """SystemExit's code as the interpreter turns it into a status: None 0, an int itself, anything
    else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _exit(code: int) -> int:
    """The interpreter's own exit steps, in its order -- its non-daemon threads joined, the atexit
    handlers run, every open file flushed -- and then ``os._exit``, as multiprocessing's forked
    children end. The teardown of modules and of C++ objects that a plain interpreter runs after
    that is left out: in a forked child it can wait for a thread of the warm interpreter that the
    fork did not copy, forever. A step that does not end within EXIT_GRACE seconds is given up
    (said on stderr): the program has ended, and its process must not hold the job."""
    import atexit
    import threading

    threading.Thread(target=_give_up, args=(code,), name="exit-grace", daemon=True).start()
    for step in (threading._shutdown, atexit._run_exitfuncs, _flush_files):  # noqa: SLF001 -- Py_FinalizeEx's order
        try:
            step()
        except Exception:  # noqa: BLE001 -- as the interpreter: said, and the exit status stands
            sys.excepthook(*sys.exc_info())
    return code


def _give_up(code: int) -> None:
    import threading
    import time

    time.sleep(EXIT_GRACE)
    waiting = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    os.write(
        2,
        f"elastic-run: the program ended (exit code {code}) but its process had not exited "
        f"{EXIT_GRACE:g} s later (threads still running: {', '.join(waiting) or 'none'}); "
        "ending it\n".encode(),
    )
    _flush_files()
    os._exit(code)


def _flush_files() -> None:
    """Flush every open Python file (module teardown would have closed them). Objects are told
    apart by their type, not ``isinstance`` (a dead weak proxy raises on that); a file that cannot
    be flushed is skipped: the program has ended, and its exit status stands. The warm interpreter's
    frozen objects are looked at too (its ``sys.stdout`` is the worker's)."""
    import io

    gc.unfreeze()
    for obj in gc.get_objects():
        if not issubclass(type(obj), io.IOBase):
            continue
        try:
            if not obj.closed and obj.writable():
                obj.flush()
        except Exception:  # noqa: BLE001 -- a broken or half-built file: nothing to save
            pass


def _name_as(argv: list[str]) -> None:
    """``/proc/PID/cmdline`` (what ps, top and pgrep -f show) as the plain start's command line."""
    if _setproctitle is not None:
        _setproctitle.setproctitle(" ".join(argv))
    name = os.path.basename(argv[0]).encode()[:15]  # the process name exec gives: the interpreter's file name
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _main_module():
    import types

    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    return module


def _print_exception() -> None:
    """The traceback as ``python`` shows it: the program's frames, not this module's or runpy's."""
    kind, value, tb = sys.exc_info()
    import runpy

    ours = (__file__, runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    sys.excepthook(kind, value.with_traceback(tb), tb)  # the hook prints the exception's own traceback
