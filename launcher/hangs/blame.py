"""What a stopped rank is doing, read from its Python stack (pure): the tie-breaker of hang blame.

When one rank stops, its peers enter the next collective and wait there. If every rank beat right
after the step's collectives, their last heartbeats are a tie and cannot tell the culprit from its
peers; their stacks can. A rank whose main thread is inside a torch.distributed call (a collective,
a barrier, send/recv, ``Work.wait``, a store's get/wait) is waiting for the others; a rank anywhere
else (a data loader, a file read, plain Python) is the one they wait for. When every rank that
stopped together waits in a torch.distributed call, nobody is late: it is a deadlock, or ranks that
called different collectives. Only Python frames are read (faulthandler's dump), so the rule is the
same for gloo and NCCL.

A dump is faulthandler's text: threads separated by blank lines, each a header and its frames,
innermost first (``File "/x/train.py", line 42 in load_batch``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "Frame",
    "Doing",
    "WAITING",
    "MAYBE_WAITING",
    "ELSEWHERE",
    "UNKNOWN",
    "parse_threads",
    "main_frames",
    "main_thread_of",
    "with_source",
    "doing",
    "excerpt",
    "blocked_at",
    "at_top_level",
    "STACK_BYTES",
]

STACK_BYTES = 2048  # the most of one rank's stack that is shared through etcd
WAITING = "waiting"  # inside a torch.distributed call: it waits for its peers
MAYBE_WAITING = "maybe"  # in backward or a device synchronize: DDP and NCCL wait for peers there
ELSEWHERE = "elsewhere"  # outside any call that waits for peers
UNKNOWN = "unknown"  # no stack came: the process did not answer (stopped, or stuck in the kernel)

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>\S+)')
_WRAPPERS = {"wrapper", "_wrapper", "inner", "_fn", "decorate_context", "_call_impl", "_wrapped_call_impl"}
_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen ")
_WAIT_CALLS = re.compile(r"\.(wait|get|wait_for_workers|barrier)\(")  # Work.wait, a store's get/wait
_SYNC_CALLS = re.compile(r"\.synchronize\(")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    source: str = ""  # the line's text, when the agent could read the file

    @property
    def library(self) -> bool:
        """Installed code (torch, the standard library), not the program's own."""
        return any(part in self.file for part in _LIBRARY) or "/lib/python3" in self.file

    def short(self) -> str:
        """``train.py:42 in load_batch``."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Doing:
    """What a rank's main thread was doing when its stack was taken."""

    kind: str  # WAITING, MAYBE_WAITING, ELSEWHERE or UNKNOWN
    call: str  # the call it waits in ("all_reduce", "Work.wait", "backward"); "" elsewhere
    at: str  # the program's own innermost frame (``train.py:42 in load_batch``); "" when unknown

    @property
    def waits(self) -> bool:
        return self.kind in (WAITING, MAYBE_WAITING)

    def said(self) -> str:
        """``in all_reduce at train.py:42 in step`` or ``at train.py:17 in load_batch``."""
        if self.kind == UNKNOWN:
            return "with no stack (its process did not answer)"
        where = f" at {self.at}" if self.at else ""
        return f"in {self.call}{where}" if self.call else where.strip()

    def as_dict(self) -> dict:
        return {"kind": self.kind, "call": self.call, "at": self.at}

    @classmethod
    def from_dict(cls, data: object) -> "Doing":
        """Validated (it is read from etcd); ValueError names what is wrong."""
        if not isinstance(data, dict) or data.get("kind") not in (WAITING, MAYBE_WAITING, ELSEWHERE, UNKNOWN):
            raise ValueError(f"what a rank is doing is malformed: {data!r}")
        call, at = data.get("call", ""), data.get("at", "")
        if not isinstance(call, str) or not isinstance(at, str):
            raise ValueError(f"what a rank is doing is malformed: {data!r}")
        return cls(data["kind"], call[:200], at[:300])


def parse_threads(dump: str) -> list[list[Frame]]:
    """faulthandler's dump as threads of frames, innermost first; lines that are not frames are left out."""
    threads = []
    for part in dump.split("\n\n"):
        frames = [_frame(m) for m in map(_FRAME.match, part.splitlines()) if m]
        if frames:
            threads.append(frames)
    return threads


def main_frames(dump: str) -> list[Frame]:
    """The main thread's frames of a dump."""
    return main_thread_of(parse_threads(dump))


def main_thread_of(threads: list[list[Frame]]) -> list[Frame]:
    """The thread that runs ``<module>``, else the last one dumped (faulthandler lists the newest
    thread first, and the main thread is the oldest)."""
    for frames in threads:
        if any(f.function == "<module>" for f in frames):
            return frames
    return threads[-1] if threads else []


def with_source(frames: list[Frame], getline: Callable[[str, int], str]) -> list[Frame]:
    """The frames with each line's text (``getline``: ``linecache.getline``), for the rule below."""
    return [Frame(f.file, f.line, f.function, getline(f.file, f.line).strip()[:200]) for f in frames]


def doing(frames: list[Frame]) -> Doing:
    """What the thread of ``frames`` (innermost first) is doing: waiting for its peers or not.

    Only the innermost run of installed frames counts (the calls the program is inside now), so a
    data loader called from inside torch.distributed code is not taken for a collective."""
    if not frames:
        return Doing(UNKNOWN, "", "")
    own = next((f for f in frames if not f.library), None)
    at = own.short() if own is not None else ""
    inside = frames[: frames.index(own)] if own is not None else frames
    dist = [f for f in inside if "/torch/distributed/" in f.file and f.function not in _WRAPPERS]
    if dist:
        return Doing(WAITING, dist[-1].function, at)
    if any("/torch/autograd/" in f.file for f in inside):
        return Doing(MAYBE_WAITING, "backward", at)
    if any("/torch/cuda/" in f.file and f.function == "synchronize" for f in inside):
        return Doing(MAYBE_WAITING, "cuda.synchronize", at)
    if not inside and own is not None:  # blocked in a C call made from the program's own line
        if _WAIT_CALLS.search(own.source):
            return Doing(WAITING, _WAIT_CALLS.search(own.source).group(1), at)
        if _SYNC_CALLS.search(own.source):
            return Doing(MAYBE_WAITING, "synchronize", at)
    return Doing(ELSEWHERE, "", at)


def excerpt(frames: list[Frame], limit: int = STACK_BYTES) -> str:
    """The frames as lines, innermost first, whole lines only and at most ``limit`` bytes."""
    lines, size = [], 0
    for f in frames:
        line = f'File "{f.file}", line {f.line} in {f.function}'
        if f.source:
            line += f"\n    {f.source}"
        if size + len(line.encode()) + 1 > limit:
            lines.append(f"... {len(frames) - len(lines)} outer frames left out")
            break
        lines.append(line)
        size += len(line.encode()) + 1
    return "\n".join(lines)


def at_top_level(frames: list[Frame]) -> bool:
    """The thread is outside every function of the program: its innermost frame that is not a
    destructor (``__del__``) is a module's top level. A main thread freeing ``main()``'s locals as
    it returns looks so (PyTorch's teardown deadlock: only the line that called ``main()``), and so
    does one blocked in a C call made from a module's top level: its native stack tells them apart
    (``native.left_script``)."""
    inner = next((f for f in frames if f.function != "__del__"), None)
    return inner is not None and inner.function == "<module>"


def blocked_at(frames: list[Frame]) -> str:
    """Where a blocked thread waits: its innermost frame, and the program's own frame that called it."""
    if not frames:
        return "?"
    own = next((f for f in frames if not f.library), None)
    first = frames[0].short()
    return first if own is None or own is frames[0] else f"{first}, called from {own.short()}"


def _frame(match: re.Match) -> Frame:
    return Frame(match["file"], int(match["line"]), match["function"])
