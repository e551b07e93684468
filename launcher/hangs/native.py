"""A live process's stack read from outside, for a worker that does nothing: every thread's
native and Python frames by ``py-spy dump --native`` where py-spy is installed, else gdb's
backtraces, else each thread's kernel wait channel (``native_stack``); and what a stack says --
the one line of what the main thread is blocked in (``blocked_in``), and whether it is past the
script's own code, freeing what it left (``left_script``: PyTorch's teardown deadlock as
``main()`` returns, a destructor at interpreter shutdown)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

__all__ = ["STACK_TIMEOUT", "native_stack", "blocked_in", "left_script"]

STACK_TIMEOUT = 20.0  # seconds py-spy or gdb may take to read a stack


def native_stack(pid: int, timeout: float = STACK_TIMEOUT) -> tuple[str, str]:
    """Every thread's stack of a live process and the tool that read it: py-spy's native and
    Python frames, else gdb's backtraces, else each thread's name and kernel wait channel."""
    spy = shutil.which("py-spy") or _beside_python("py-spy")
    if spy is not None:
        text = _run([spy, "dump", "--native", "--pid", str(pid)], timeout)
        if "Thread" in text:
            return text, "py-spy"
    gdb = shutil.which("gdb")
    if gdb is not None:
        text = _run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 16"], timeout)
        if "#0" in text:
            return text, "gdb"
    return _wait_channels(pid), "proc"


def blocked_in(stack: str, tool: str, frames: int = 4) -> str:
    """One line: the main thread's innermost named frames, innermost first."""
    if tool == "py-spy":
        names = _spy_main_frames(stack)
    elif tool == "gdb":
        names = _gdb_main_frames(stack)
    else:
        return (stack.splitlines() or ["nothing could be read"])[0] + " (no py-spy or gdb here for its frames)"
    return " < ".join(names[:frames]) if names else "frames that could not be read"


def _spy_main_frames(text: str) -> list[str]:
    """py-spy's main thread: its two innermost named native frames (not bare addresses, nor the
    call machinery of ctypes and libffi), then its two innermost Python frames."""
    native, python = [], []
    for frame in _spy_main_thread(text):
        if _is_python(frame):
            python.append(frame)
        elif not frame.startswith("0x") and not any(m in frame for m in _MACHINERY) and not python:
            native.append(frame)
    return native[:2] + python[:2]


def _spy_main_thread(text: str) -> list[str]:
    """Every frame py-spy printed for the main thread, innermost first."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"MainThread"' in line), None)
    frames = []
    for line in lines[start + 1 :] if start is not None else ():
        if not line.startswith("    "):
            break
        frames.append(line.strip())
    return frames


def _is_python(frame: str) -> bool:
    return ".py:" in frame or "(<frozen" in frame


_MACHINERY = ("libffi", "ffi_call", "callproc.c", "_ctypes.c", "(python3", "ceval.c", "call.c")


def left_script(stack: str, tool: str) -> bool:
    """The main thread is past the script's own code, freeing what it left: every Python frame on it
    is a destructor (``__del__``) or a module's top level (``<module>``: the line that called
    ``main()``, whose locals are being freed), with a destructor -- Python's or native (a C++ ``~``,
    a ``dealloc``) -- inside it; or the interpreter is shutting down (its finalization frames, the
    one thing gdb shows of it). False for any stack inside a function of the script or a library
    (a collective, a ``recv``, a DataLoader's destructor called from a training loop) and for a
    stack that could not be read."""
    if tool == "gdb":
        return any(mark in name for name in _gdb_main_frames(stack) for mark in _FINALIZING)
    if tool != "py-spy":
        return False
    frames = _spy_main_thread(stack)
    python = [i for i, frame in enumerate(frames) if _is_python(frame)]
    if not python:
        return any(mark in frame for frame in frames for mark in _FINALIZING)
    script = [frames[i] for i in python if not _python_name(frames[i]).endswith("__del__")]
    freeing = len(script) < len(python) or any(_destructor(f) for f in frames[: python[0]])
    return freeing and (not script or _python_name(script[0]) == "<module>")


_FINALIZING = ("Py_FinalizeEx", "_Py_Finalize", "finalize_modules", "atexit_callfuncs")


def _python_name(frame: str) -> str:
    """A frame's function name as py-spy prints it (``name (file:line)`` or ``name (library)``)."""
    return frame.split(" (", 1)[0]


def _destructor(frame: str) -> bool:
    name = _python_name(frame)
    return "::~" in name or "dealloc" in name.lower() or "tp_finalize" in name or "CallFinalizer" in name


_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)")


def _gdb_main_frames(text: str) -> list[str]:
    """gdb's thread 1 (the main thread): each frame's function name."""
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith("Thread "):
            inside = line.startswith("Thread 1 ")
        elif inside and (match := _GDB_FRAME.match(line)) and match.group(1) != "??":
            names.append(match.group(1))
    return names


def _wait_channels(pid: int) -> str:
    """Each thread's name and what the kernel says it waits in (``/proc/PID/task/TID/wchan``)."""
    rows = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return "its threads could not be read"
    for tid in tids:
        rows.append(f"{_read(f'/proc/{pid}/task/{tid}/comm')} waits in {_read(f'/proc/{pid}/task/{tid}/wchan') or '?'}")
    return "; ".join(rows)


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def _beside_python(name: str) -> str | None:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _run(command: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout
