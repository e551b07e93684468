"""A worker that writes down how it was started, for the warm-start tests:

    warm_probe.py OUT_DIR [--fail-first] [--exit N] [--raise] [--signal NAME] [--matmul] [--run SECONDS]
                  [--linger-thread] [--stuck-teardown] [--unflushed] [--preopened]

Writes OUT_DIR/<restart>-<rank>.json: its pid, session and process group, parent-death signal,
stdin, argv, cwd, __main__, sys.path[0], signal handlers, environment, which of json/decimal/numpy
were imported before its first line, whether the collector is on and how many objects are frozen,
and a number from numpy's global generator and from random.
--linger-thread leaves a non-daemon thread that never ends; --stuck-teardown a module-level object
whose finalizer waits forever when the interpreter tears the modules down (as a destructor that
waits for a thread the fork did not copy); --unflushed leaves a file written but neither flushed nor
closed (OUT_DIR/<restart>-<rank>.unflushed, which the interpreter's exit must flush) and a weak proxy
whose object is gone; --preopened writes <restart>-<rank> into tests/e2e/workers/preopened.py's file
(opened when that module is imported: by the warm interpreter, when preloaded), unflushed."""

import sys

ALREADY = {name: name in sys.modules for name in ("decimal", "numpy")}  # before this file imports them

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

out = sys.argv[1]
flags = sys.argv[2:]


def pdeathsig() -> int:
    value = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


def handler(signum: int) -> str:
    current = signal.getsignal(signum)
    return current.__name__ if callable(current) else str(current)


record = {
    "pid": os.getpid(),
    "session_leader": os.getsid(0) == os.getpid(),
    "group_leader": os.getpgid(0) == os.getpid(),
    "pdeathsig": pdeathsig(),
    "stdin": os.readlink("/proc/self/fd/0"),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "main": os.path.abspath(sys.modules["__main__"].__file__),
    "main_name": __name__,
    "path0": sys.path[0],
    "handlers": {
        name: handler(getattr(signal, name)) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGCHLD", "SIGPIPE")
    },
    "env": dict(os.environ),
    "preloaded": ALREADY,
    "random": random.random(),
    "cmdline": open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode().strip(),
    "comm": open("/proc/self/comm").read().strip(),
    "gc": gc.isenabled(),
    "frozen": gc.get_freeze_count(),  # objects made before the fork, out of this process's collections
}
try:
    import numpy

    record["numpy"] = float(numpy.random.rand())
    if "--matmul" in flags:  # OpenBLAS's threads, started in the warm interpreter, across the fork
        a = numpy.ones((512, 512))
        record["matmul"] = float((a @ a)[0, 0])
except ImportError:
    pass
name = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{os.environ['RANK']}"
with open(os.path.join(out, name + ".tmp"), "w") as handle:
    json.dump(record, handle)
os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name + ".json"))
print(f"probe rank {os.environ['RANK']} written", flush=True)
if "--fail-first" in flags and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(1)  # the restart is forked warm for sure (the first start may be plain)
if "--run" in flags:
    time.sleep(float(flags[flags.index("--run") + 1]))
if "--raise" in flags:
    raise ValueError("the probe was told to raise")
if "--exit" in flags:
    sys.exit(int(flags[flags.index("--exit") + 1]))
if "--signal" in flags:
    import signal

    os.kill(os.getpid(), getattr(signal, flags[flags.index("--signal") + 1]))


class _StuckAtTeardown:
    def __del__(self) -> None:
        import threading

        threading.Event().wait()  # the interpreter's teardown never ends


if "--stuck-teardown" in flags:
    STUCK = _StuckAtTeardown()
    sys.modules[__name__].__dict__["STUCK"] = STUCK
if "--preopened" in flags:  # a line into the preloaded module's buffered file, left for the exit to flush
    import preopened

    preopened.LOG.write(f"{name}\n")
if "--unflushed" in flags:
    import weakref

    class _Gone:
        pass

    LEFT_OPEN = open(os.path.join(out, name + ".unflushed"), "w")  # noqa: SIM115 -- left open on purpose
    LEFT_OPEN.write("written at exit\n")
    DEAD = [weakref.proxy(_Gone())]  # its object is gone already: isinstance() on it raises
if "--linger-thread" in flags:
    import threading

    threading.Thread(target=threading.Event().wait, name="lingering", daemon=False).start()
print(f"probe rank {os.environ['RANK']} ends", flush=True)
