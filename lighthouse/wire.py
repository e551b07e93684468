"""torchft's wire format (torchft 0.2.0, ``proto/torchft.proto``): the messages a Manager and a
LighthouseClient exchange with a Lighthouse, and the gRPC method paths they call.

The message classes are built at import from a descriptor written here (the fields' names, numbers
and types are the format; nothing is generated at build time), in a pool of their own so they never
clash with a torchft that is installed beside this package.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

__all__ = [
    "PACKAGE",
    "QUORUM_METHOD",
    "HEARTBEAT_METHOD",
    "KILL_METHOD",
    "RELAY_METHOD",
    "QuorumMember",
    "Quorum",
    "LighthouseQuorumRequest",
    "LighthouseQuorumResponse",
    "LighthouseHeartbeatRequest",
    "LighthouseHeartbeatResponse",
    "KillRequest",
    "KillResponse",
    "identity",
]

PACKAGE = "torchft"
QUORUM_METHOD = "/torchft.LighthouseService/Quorum"
HEARTBEAT_METHOD = "/torchft.LighthouseService/Heartbeat"
KILL_METHOD = "/torchft.ManagerService/Kill"
# Not torchft's: how a replica hands the heartbeats it heard to the one that forms the quorums.
RELAY_METHOD = "/etcd_elastic.LighthouseRelay/Heartbeats"

_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {
    "string": _F.TYPE_STRING,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "bool": _F.TYPE_BOOL,
}

# message -> (field name, number, type, repeated); a type that is not a scalar is a message's name.
_MESSAGES: dict[str, tuple[tuple[str, int, str, bool], ...]] = {
    "QuorumMember": (
        ("replica_id", 1, "string", False),
        ("address", 2, "string", False),
        ("store_address", 3, "string", False),
        ("step", 4, "int64", False),
        ("world_size", 5, "uint64", False),
        ("shrink_only", 6, "bool", False),
        ("data", 7, "string", False),  # the client's dict, as JSON
        ("commit_failures", 8, "int64", False),
    ),
    "Quorum": (
        ("quorum_id", 1, "int64", False),
        ("participants", 2, ".torchft.QuorumMember", True),
        ("created", 3, ".google.protobuf.Timestamp", False),
    ),
    "LighthouseQuorumRequest": (("requester", 1, ".torchft.QuorumMember", False),),
    "LighthouseQuorumResponse": (("quorum", 1, ".torchft.Quorum", False),),
    "LighthouseHeartbeatRequest": (("replica_id", 1, "string", False),),
    "LighthouseHeartbeatResponse": (),
    "KillRequest": (("msg", 1, "string", False),),
    "KillResponse": (),
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="etcd_elastic/torchft.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(
                name=field_name,
                number=number,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if kind in _TYPES:
                field.type = _TYPES[kind]
            else:
                field.type = _F.TYPE_MESSAGE
                field.type_name = kind
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES
    }


_CLASSES = _classes()
QuorumMember = _CLASSES["QuorumMember"]
Quorum = _CLASSES["Quorum"]
LighthouseQuorumRequest = _CLASSES["LighthouseQuorumRequest"]
LighthouseQuorumResponse = _CLASSES["LighthouseQuorumResponse"]
LighthouseHeartbeatRequest = _CLASSES["LighthouseHeartbeatRequest"]
LighthouseHeartbeatResponse = _CLASSES["LighthouseHeartbeatResponse"]
KillRequest = _CLASSES["KillRequest"]
KillResponse = _CLASSES["KillResponse"]


def identity(raw: bytes) -> bytes:
    """The (de)serializer of a method whose bytes are passed on or decoded by the caller."""
    return raw
