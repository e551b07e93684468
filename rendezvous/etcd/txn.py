"""The transaction vocabulary, as etcd's concurrency recipes write it: compares (``create_revision``,
``mod_revision``, value, lease), operations (put, get, delete; of a key or a prefix), and the
key/value a read returns. Pure protobuf building: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etcd3 import etcdrpc

__all__ = [
    "KeyValue",
    "prefix_range_end",
    "compare_created",
    "compare_mod_revision",
    "compare_value",
    "op_put",
    "op_get",
    "op_count",
    "op_delete",
]


@dataclass(frozen=True)
class KeyValue:
    """A key as etcd stores it, with the revisions the CAS logic compares against."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_proto(cls, kv: Any) -> "KeyValue":
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def _b(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def prefix_range_end(prefix: str | bytes) -> bytes:
    """The exclusive end of the key range that holds every key starting with ``prefix``."""
    raw = bytearray(_b(prefix))
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


def compare_created(key: str | bytes, revision: int = 0) -> Any:
    """``create_revision(key) == revision``; revision 0 means "the key does not exist"."""
    return etcdrpc.Compare(
        key=_b(key), result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, create_revision=revision
    )


def compare_mod_revision(key: str | bytes, revision: int) -> Any:
    """``mod_revision(key) == revision``: nobody wrote the key since we read it."""
    return etcdrpc.Compare(key=_b(key), result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.MOD, mod_revision=revision)


def compare_value(key: str | bytes, value: bytes) -> Any:
    """``value(key) == value`` (false when the key does not exist)."""
    return etcdrpc.Compare(key=_b(key), result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.VALUE, value=value)


def op_put(key: str | bytes, value: bytes, lease: int = 0) -> Any:
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=_b(key), value=value, lease=lease))


def op_get(key: str | bytes, prefix: bool = False) -> Any:
    request = etcdrpc.RangeRequest(key=_b(key))
    if prefix:
        request.range_end = prefix_range_end(key)
    return etcdrpc.RequestOp(request_range=request)


def op_delete(key: str | bytes, prefix: bool = False) -> Any:
    request = etcdrpc.DeleteRangeRequest(key=_b(key))
    if prefix:
        request.range_end = prefix_range_end(key)
    return etcdrpc.RequestOp(request_delete_range=request)


def op_count(prefix: str | bytes) -> Any:
    """How many keys are under ``prefix`` (the count only, no values)."""
    request = etcdrpc.RangeRequest(key=_b(prefix), range_end=prefix_range_end(prefix), count_only=True)
    return etcdrpc.RequestOp(request_range=request)
