"""What can be read of torch's own rendezvous state -- the pickled ``_RendezvousState`` that torch's
``DynamicRendezvousHandler`` keeps in a backend (the ``etcd-v3`` torchrun handler's jobs) --
without unpickling it: its opcodes are walked with ``pickletools.genops`` and only plain data is
built (strings, numbers, booleans, containers). No class is looked up, no callable is called; an
object is a dict of its state with the name of its class beside it, as text. So a value written by
anyone into etcd can be shown, and never run.

``read_torch_state`` gives the round, whether the rendezvous is complete and closed, the
participants (address, pid, local id, rank), the waiting and redundant nodes' counts, the
newest heartbeat's age and the nodes heartbeats are kept of; ``is_torch_state`` tells torch's
pickles from this project's JSON.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from rendezvous.errors import RendezvousStateError

__all__ = ["TorchState", "TorchNode", "is_torch_state", "read_torch_state", "walk"]

_CLASS = "__class__"
_MARK = object()


@dataclass(frozen=True)
class TorchNode:
    addr: str
    pid: int
    local_id: int
    rank: int | None  # None: waiting, not a participant


@dataclass(frozen=True)
class TorchState:
    """torch's rendezvous state, as far as plain data says it."""

    round: int
    complete: bool
    closed: bool
    participants: tuple[TorchNode, ...]
    waiting: int
    redundant: int
    last_heartbeat: datetime | None  # the newest node heartbeat (UTC), None when none could be read
    beating: tuple[TorchNode, ...] = ()  # the nodes torch keeps a heartbeat of (it drops a dead one's)


def is_torch_state(state: bytes) -> bool:
    """A pickle (protocol 2 and later start with PROTO), not this project's JSON."""
    return state[:1] == b"\x80"


def read_torch_state(state: bytes) -> TorchState:
    """The fields of torch's pickled state; RendezvousStateError when it is not one."""
    try:
        root = walk(state)
    except Exception as exc:  # noqa: BLE001 -- any malformed pickle: one error naming it
        raise RendezvousStateError(f"torch's rendezvous state could not be read: {exc}") from None
    if not isinstance(root, dict) or not str(root.get(_CLASS, "")).endswith("_RendezvousState"):
        raise RendezvousStateError("the state is a pickle, but not torch's rendezvous state")
    participants = root.get("participants") or {}
    nodes = [_node(desc, rank) for desc, rank in _items(participants)]
    nodes += [_node(desc, None) for desc in _members(root.get("wait_list"))]
    beats = [when for _, when in _items(root.get("last_heartbeats") or {}) if isinstance(when, datetime)]
    return TorchState(
        round=int(root.get("round") or 0),
        complete=bool(root.get("complete")),
        closed=bool(root.get("closed")),
        participants=tuple(sorted((n for n in nodes if n.rank is not None), key=lambda n: n.rank)),
        waiting=len(_members(root.get("wait_list"))),
        redundant=len(_members(root.get("redundancy_list"))),
        last_heartbeat=max(beats) if beats else None,
        beating=tuple(_node(desc, None) for desc, _ in _items(root.get("last_heartbeats") or {})),
    )


def _node(desc: Any, rank: Any) -> TorchNode:
    fields = desc if isinstance(desc, dict) else {}
    return TorchNode(
        str(fields.get("addr", "?")),
        int(fields.get("pid") or 0),
        int(fields.get("local_id") or 0),
        rank if isinstance(rank, int) else None,
    )


def _items(value: Any) -> list[tuple[Any, Any]]:
    return list(value.items) if isinstance(value, _Pairs) else []


def _members(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


class _Pairs:
    """A dict whose keys may be objects (torch keys its participants by node): kept as pairs."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []

    def get(self, key: Any, default: Any = None) -> Any:
        return next((v for k, v in self.items if k == key), default)


def walk(data: bytes) -> Any:
    """The plain data a pickle describes, built from its opcodes alone (see the module's note)."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack.pop()
        _step(name, arg, stack, memo)
    raise ValueError("no STOP opcode")


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_VALUES = {
    "BININT",
    "BININT1",
    "BININT2",
    "LONG1",
    "LONG4",
    "BINFLOAT",
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINUNICODE8",
    "SHORT_BINBYTES",
    "BINBYTES",
    "BINBYTES8",
    "SHORT_BINSTRING",
    "BINSTRING",
}  # opcodes whose argument is the value itself


def _step(name: str, arg: Any, stack: list[Any], memo: dict[int, Any]) -> None:
    if name == "MEMOIZE":
        memo[len(memo)] = stack[-1]
    elif name in ("BINPUT", "LONG_BINPUT"):
        memo[arg] = stack[-1]
    elif name in ("BINGET", "LONG_BINGET"):
        stack.append(memo[arg])
    elif name in _CONSTANTS:
        stack.append(_CONSTANTS[name])
    elif name in _VALUES:
        stack.append(arg)
    elif name in ("EMPTY_DICT", "EMPTY_SET", "EMPTY_LIST", "EMPTY_TUPLE"):
        stack.append(_Pairs() if name == "EMPTY_DICT" else [] if name != "EMPTY_TUPLE" else ())
    elif name == "MARK":
        stack.append(_MARK)
    elif name in _TUPLES:
        count = _TUPLES[name]
        items = tuple(stack[-count:])
        del stack[-count:]
        stack.append(items)
    else:
        _compound(name, stack)


def _compound(name: str, stack: list[Any]) -> None:
    if name in ("SETITEMS", "ADDITEMS", "APPENDS", "TUPLE"):
        at = max(i for i, v in enumerate(stack) if v is _MARK)
        items, target = stack[at + 1 :], None
        del stack[at:]
        if name == "TUPLE":
            stack.append(tuple(items))
            return
        target = stack[-1]
        if name == "SETITEMS":
            target.items.extend(zip(items[::2], items[1::2]))
        else:
            target.extend(items)
    elif name == "SETITEM":
        value, key = stack.pop(), stack.pop()
        stack[-1].items.append((key, value))
    elif name == "APPEND":
        value = stack.pop()
        stack[-1].append(value)
    elif name == "STACK_GLOBAL":
        attr, module = stack.pop(), stack.pop()
        stack.append(f"{module}.{attr}")  # a name, never imported
    elif name in ("NEWOBJ", "REDUCE"):
        args, cls = stack.pop(), stack.pop()
        stack.append(_made(cls, args))
    elif name == "BUILD":
        state = stack.pop()
        target = stack[-1]
        if isinstance(target, dict) and isinstance(state, _Pairs):
            target.update((k, v) for k, v in state.items if isinstance(k, str))
    else:
        raise ValueError(f"opcode {name} is not one torch's state uses")


def _made(cls: Any, args: Any) -> Any:
    """What calling ``cls(*args)`` stands for: a datetime, timezone or timedelta as itself (from
    its plain arguments), anything else as the dict of its state to come (with its class's name)."""
    if cls == "datetime.timedelta" and all(isinstance(a, int) for a in args):
        return timedelta(*args)
    if cls == "datetime.timezone" and args and isinstance(args[0], timedelta):
        return timezone(args[0])
    if cls == "datetime.datetime" and args and isinstance(args[0], bytes) and len(args[0]) == 10:
        tz = args[1] if len(args) > 1 and isinstance(args[1], timezone) else None
        return _datetime(args[0], tz)
    return {_CLASS: str(cls)}


def _datetime(packed: bytes, tz: timezone | None) -> datetime:
    """datetime's own pickled form: year (2 bytes), month, day, hour, minute, second, microsecond (3)."""
    year = packed[0] * 256 + packed[1]
    micro = (packed[7] << 16) | (packed[8] << 8) | packed[9]
    return datetime(year, packed[2], packed[3], packed[4], packed[5], packed[6], micro, tzinfo=tz)
