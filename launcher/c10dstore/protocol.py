"""The c10d TCPStore wire protocol, server side, as pure functions and one table.

torch's ``TCPStore`` client (``is_master=False``) talks to the store the agent hosts, so the
bytes are torch's: every request is one command byte followed by its fields, little-endian; a key
or a value is a uint64 length and its bytes. A connection's first request must be VALIDATE with
torch's magic number. Replies: a value (length and bytes), an int64, or one byte (CHECK: ready
0 / not ready 1; WAIT: stop waiting 0 / wait cancelled 1). SET, APPEND, MULTI_SET and QUEUE_PUSH
have no reply; a WAIT is answered once all its keys exist, which may be much later.

``parse`` decodes one request from the front of a buffer (None while it is incomplete);
``Table`` is the store's content and who waits for what, and says what to send to whom.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["MAGIC", "Op", "ProtocolError", "Request", "Table", "parse"]

MAGIC = 0x3C85F7CE
MAX_KEY = 8 * 1024  # torch's server limits, so a client that is refused there is refused here
MAX_VALUE = 8 * 1024 * 1024
MAX_KEYS = 128 * 1024

READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"


class Op(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16


# each command's fields: u32, i64, key, value, keys (a count, then keys), pairs (a count, then key/value)
_FIELDS: dict[Op, tuple[str, ...]] = {
    Op.VALIDATE: ("u32",),
    Op.SET: ("key", "value"),
    Op.COMPARE_SET: ("key", "value", "value"),
    Op.GET: ("key",),
    Op.ADD: ("key", "i64"),
    Op.CHECK: ("keys",),
    Op.WAIT: ("keys",),
    Op.GETNUMKEYS: (),
    Op.DELETE_KEY: ("key",),
    Op.APPEND: ("key", "value"),
    Op.MULTI_GET: ("keys",),
    Op.MULTI_SET: ("pairs",),
    Op.CANCEL_WAIT: (),
    Op.PING: ("u32",),
    Op.QUEUE_PUSH: ("key", "value"),
    Op.QUEUE_POP: ("key",),
    Op.QUEUE_LEN: ("key",),
}


class ProtocolError(ValueError):
    """A request this store will not serve (unknown command, a key or value over the limits):
    the connection is closed, as torch's server closes it."""


class _Incomplete(Exception):
    pass


@dataclass(frozen=True)
class Request:
    op: Op
    args: tuple


def parse(buffer: bytes | bytearray | memoryview) -> tuple[Request, int] | None:
    """The request at the front of ``buffer`` and how many bytes it took, or None until all of it
    has arrived. Raises ProtocolError for a request no TCPStore client sends."""
    if not buffer:
        return None
    try:
        op = Op(buffer[0])
    except ValueError:
        raise ProtocolError(f"unknown command {buffer[0]}") from None
    reader = _Reader(memoryview(buffer), 1)
    try:
        args = tuple(reader.field(kind) for kind in _FIELDS[op])
    except _Incomplete:
        return None
    return Request(op, args), reader.pos


class _Reader:
    def __init__(self, view: memoryview, pos: int) -> None:
        self.view, self.pos = view, pos

    def _take(self, size: int) -> bytes:
        if self.pos + size > len(self.view):
            raise _Incomplete
        chunk = bytes(self.view[self.pos : self.pos + size])
        self.pos += size
        return chunk

    def _number(self, fmt: str) -> int:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _sized(self, limit: int, what: str) -> bytes:
        size = self._number("<Q")
        if size > limit:
            raise ProtocolError(f"a {what} of {size} bytes (at most {limit})")
        return self._take(size)

    def _count(self) -> int:
        count = self._number("<Q")
        if count > MAX_KEYS:
            raise ProtocolError(f"{count} keys in one request (at most {MAX_KEYS})")
        return count

    def field(self, kind: str):
        if kind == "u32":
            return self._number("<I")
        if kind == "i64":
            return self._number("<q")
        if kind == "key":
            return self._sized(MAX_KEY, "key")
        if kind == "value":
            return self._sized(MAX_VALUE, "value")
        if kind == "keys":
            return tuple(self._sized(MAX_KEY, "key") for _ in range(self._count()))
        return tuple((self._sized(MAX_KEY, "key"), self._sized(MAX_VALUE, "value")) for _ in range(self._count()))


def value(data: bytes) -> bytes:
    """A value on the wire: its length (uint64) and its bytes."""
    return struct.pack("<Q", len(data)) + data


def int64(number: int) -> bytes:
    return struct.pack("<q", number)


Reply = tuple[Hashable, bytes]  # (the client to send to, the bytes)


class Table:
    """The store's keys, its queues, and the clients waiting for keys (torch's semantics: a
    waiting client is told once every key it asked for exists; a queue's push wakes one waiter)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self._waiting: dict[bytes, list[Hashable]] = {}  # key -> clients waiting for it
        self._missing: dict[Hashable, int] = {}  # client -> how many of its keys are still missing

    def handle(self, client: Hashable, request: Request) -> list[Reply]:
        """Apply one request from ``client`` (validated already); what to send, to whom."""
        op, args = request.op, request.args
        handler = getattr(self, "_" + op.name.lower())
        return handler(client, *args)

    def drop(self, client: Hashable) -> None:
        """A client that went away waits for nothing any more."""
        if self._missing.pop(client, None) is None:
            return
        for key in list(self._waiting):
            self._waiting[key] = [c for c in self._waiting[key] if c != client]
            if not self._waiting[key]:
                del self._waiting[key]

    # -- the commands ----------------------------------------------------------------------------
    def _validate(self, client, magic):
        return []  # a second VALIDATE on a validated connection: nothing to do

    def _ping(self, client, nonce):
        return [(client, struct.pack("<I", nonce))]

    def _set(self, client, key, data):
        self.data[key] = data
        return self._wake_all(key)

    def _multi_set(self, client, pairs):
        replies = []
        for key, data in pairs:
            replies += self._set(client, key, data)
        return replies

    def _compare_set(self, client, key, expected, new):
        current = self.data.get(key)
        if current is None:
            if expected:
                return [(client, value(expected)), *self._wake_all(key)]  # torch answers the expected value
            self.data[key] = current = new
        elif current == expected:
            self.data[key] = current = new
        return [(client, value(current)), *self._wake_all(key)]

    def _get(self, client, key):
        return [(client, value(self.data.get(key, b"")))]

    def _multi_get(self, client, keys):
        return [(client, b"".join(value(self.data.get(key, b"")) for key in keys))]

    def _add(self, client, key, amount):
        total = amount + (int(self.data[key]) if key in self.data else 0)
        self.data[key] = str(total).encode()
        return [(client, int64(total)), *self._wake_all(key)]

    def _append(self, client, key, data):
        self.data[key] = self.data.get(key, b"") + data
        return self._wake_all(key)

    def _check(self, client, keys):
        return [(client, READY if all(self._present(key) for key in keys) else NOT_READY)]

    def _wait(self, client, keys):
        if all(self._present(key) for key in keys):
            return [(client, STOP_WAITING)]
        missing = [key for key in keys if key not in self.data]
        for key in missing:
            self._waiting.setdefault(key, []).append(client)
        self._missing[client] = len(missing)
        return []

    def _cancel_wait(self, client):
        self.drop(client)
        return [(client, WAIT_CANCELED)]

    def _getnumkeys(self, client):
        return [(client, int64(len(self.data)))]

    def _delete_key(self, client, key):
        return [(client, int64(1 if self.data.pop(key, None) is not None else 0))]

    def _queue_push(self, client, key, data):
        self.queues.setdefault(key, deque()).append(data)
        return self._wake_one(key)

    def _queue_pop(self, client, key):
        queue = self.queues.setdefault(key, deque())
        if not queue:
            return [(client, int64(0))]
        return [(client, int64(len(queue)) + value(queue.popleft()))]

    def _queue_len(self, client, key):
        return [(client, int64(len(self.queues.get(key, ()))))]

    # -- waiting ---------------------------------------------------------------------------------
    def _present(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def _wake_all(self, key: bytes) -> list[Reply]:
        replies = []
        for client in self._waiting.pop(key, []):
            if self._countdown(client):
                replies.append((client, STOP_WAITING))
        return replies

    def _wake_one(self, key: bytes) -> list[Reply]:
        waiting = self._waiting.get(key, [])
        for client in list(waiting):
            waiting.remove(client)
            if self._countdown(client):
                return [(client, STOP_WAITING)]
        return []

    def _countdown(self, client: Hashable) -> bool:
        """One more of ``client``'s keys exists; True when that was its last missing one."""
        if client not in self._missing:
            return False
        left = self._missing[client] - 1
        if left > 0:
            self._missing[client] = left
            return False
        self._missing.pop(client, None)
        return True
