"""The agent store's protocol without sockets: decoding torch's requests byte by byte, and the
table's answers (waits woken by sets, adds and pushes; cancelled waits; queues)."""

from __future__ import annotations

import struct

import pytest

from launcher.c10dstore.protocol import MAGIC, Op, ProtocolError, Request, Table, parse


def key(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def test_a_request_is_decoded_only_once_all_of_it_has_arrived():
    wire = bytes([Op.SET]) + key(b"/k") + key(b"value") + bytes([Op.VALIDATE]) + struct.pack("<I", MAGIC)
    set_length = 1 + 8 + 2 + 8 + 5
    for cut in range(set_length):
        assert parse(wire[:cut]) is None, cut
    request, used = parse(wire)
    assert request == Request(Op.SET, (b"/k", b"value")) and used == set_length
    assert parse(wire[used:]) == (Request(Op.VALIDATE, (MAGIC,)), 5)


def test_every_field_shape_decodes():
    keys = struct.pack("<Q", 2) + key(b"/a") + key(b"/b")
    assert parse(bytes([Op.WAIT]) + keys)[0].args == ((b"/a", b"/b"),)
    assert parse(bytes([Op.ADD]) + key(b"/n") + struct.pack("<q", -3))[0].args == (b"/n", -3)
    pairs = struct.pack("<Q", 1) + key(b"/a") + key(b"1")
    assert parse(bytes([Op.MULTI_SET]) + pairs)[0].args == (((b"/a", b"1"),),)
    assert parse(bytes([Op.GETNUMKEYS]))[0] == Request(Op.GETNUMKEYS, ())


def test_what_no_torch_client_sends_is_refused():
    with pytest.raises(ProtocolError, match="unknown command 99"):
        parse(bytes([99]))
    with pytest.raises(ProtocolError, match="key of 9000 bytes"):
        parse(bytes([Op.GET]) + struct.pack("<Q", 9000))


def test_a_wait_is_answered_when_its_last_key_is_set():
    table = Table()
    assert table.handle("w", Request(Op.WAIT, ((b"/a", b"/b"),))) == []
    assert table.handle("s", Request(Op.SET, (b"/a", b"1"))) == []
    assert table.handle("s", Request(Op.ADD, (b"/b", 2))) == [("s", struct.pack("<q", 2)), ("w", b"\x00")]
    assert table.handle("s", Request(Op.SET, (b"/b", b"x"))) == []  # told once


def test_a_wait_on_keys_of_which_only_some_exist_waits_for_the_others():
    table = Table()
    table.handle("s", Request(Op.SET, (b"/a", b"1")))
    assert table.handle("w", Request(Op.WAIT, ((b"/a", b"/b", b"/c"),))) == []  # /a exists, /b and /c do not
    assert table.handle("s", Request(Op.SET, (b"/b", b"1"))) == []
    assert table.handle("s", Request(Op.SET, (b"/c", b"1"))) == [("w", b"\x00")]


def test_a_cancelled_wait_is_not_answered_later():
    table = Table()
    table.handle("w", Request(Op.WAIT, ((b"/a",),)))
    assert table.handle("w", Request(Op.CANCEL_WAIT, ())) == [("w", b"\x01")]
    assert table.handle("s", Request(Op.SET, (b"/a", b"1"))) == []


def test_a_client_that_goes_away_waits_for_nothing():
    table = Table()
    table.handle("w", Request(Op.WAIT, ((b"/a",),)))
    table.drop("w")
    assert table.handle("s", Request(Op.SET, (b"/a", b"1"))) == []


def test_a_push_wakes_one_waiter_and_pops_in_order():
    table = Table()
    table.handle("w1", Request(Op.WAIT, ((b"/q",),)))
    table.handle("w2", Request(Op.WAIT, ((b"/q",),)))
    assert table.handle("p", Request(Op.QUEUE_PUSH, (b"/q", b"one"))) == [("w1", b"\x00")]
    assert table.handle("p", Request(Op.QUEUE_PUSH, (b"/q", b"two"))) == [("w2", b"\x00")]
    assert table.handle("w1", Request(Op.QUEUE_POP, (b"/q",))) == [("w1", struct.pack("<q", 2) + key(b"one"))]
    assert table.handle("w1", Request(Op.QUEUE_LEN, (b"/q",))) == [("w1", struct.pack("<q", 1))]


def test_compare_set_answers_as_torchs_server():
    table = Table()
    assert table.handle("c", Request(Op.COMPARE_SET, (b"/k", b"", b"new"))) == [("c", key(b"new"))]
    assert table.handle("c", Request(Op.COMPARE_SET, (b"/k", b"old", b"x"))) == [("c", key(b"new"))]
    assert table.handle("c", Request(Op.COMPARE_SET, (b"/gone", b"y", b"z"))) == [("c", key(b"y"))]
    assert b"/gone" not in table.data


def test_a_node_that_announces_again_and_again_keeps_two_sockets_and_serves_the_one_the_round_names():
    from launcher.c10dstore import StoreHost

    host = StoreHost()
    ports = [host.port() for _ in range(5)]
    try:
        assert list(host._announced) == ports[-2:]  # the older ones are closed
        host.serve(ports[-2])
        assert host.server is not None and host.server.port == ports[-2] and not host._announced
    finally:
        host.close()
    assert host.server is None
