"""The line-serving pieces on real sockets: ``read_lines`` (what a readable socket brought, by whole
lines), ``LineServer`` (one thread, a callback a line, connections ended by the callback, an
over-long line or the peer) and the peers' ``Responder`` (a pong for every ping, the contact log
moved by acknowledgments, a watcher's goodbye releasing its round)."""

from __future__ import annotations

import socket
import threading

import pytest

from launcher.peers.contact import ContactLog
from launcher.peers.responder import Responder
from launcher.peers.wire import bye, parse, ping
from launcher.selector.lineserver import LineServer, read_lines


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_read_lines_gives_whole_lines_and_keeps_the_rest(pair):
    writer, reader = pair
    inbox = bytearray()
    writer.sendall(b"one\ntwo\nthr")
    assert read_lines(reader, inbox) == [b"one", b"two"]
    assert inbox == b"thr"
    writer.sendall(b"ee\n")
    assert read_lines(reader, inbox) == [b"three"]
    assert inbox == b""


def test_read_lines_says_nothing_yet_then_closed(pair):
    writer, reader = pair
    inbox = bytearray()
    assert read_lines(reader, inbox) == []  # nothing to read on a non-blocking socket
    writer.close()
    assert read_lines(reader, inbox) is None


def _serve(on_line, **kwargs):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    closed = threading.Event()
    server = LineServer(listener, on_line, lambda connection: closed.set(), name="test-lines", **kwargs)
    return server, listener.getsockname(), closed


def _client(address) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.settimeout(5)
    return sock


def test_a_line_server_answers_each_line_from_its_thread_until_the_callback_says_stop():
    threads = set()

    def echo(connection, line: bytes) -> bool:
        threads.add(threading.current_thread().name)
        connection.send(line.upper() + b"\n")
        return line != b"stop"

    server, address, closed = _serve(echo)
    try:
        with _client(address) as sock:
            sock.sendall(b"a\nb\n")
            assert sock.recv(100).split() in ([b"A", b"B"], [b"A"])
            sock.sendall(b"stop\n")
            assert closed.wait(5), "the callback's False ends the connection"
            assert sock.recv(100).rstrip().endswith(b"STOP")
            assert sock.recv(100) == b"", "the server closed its side"
        assert threads == {"test-lines"}
    finally:
        server.close()
    with pytest.raises(OSError):
        _client(address)  # the listener is closed with the server


def test_a_line_longer_than_the_limit_ends_its_connection():
    server, address, closed = _serve(lambda connection, line: True, max_line=16)
    try:
        with _client(address) as sock:
            sock.sendall(b"x" * 64)  # no newline: an over-long line under way
            assert closed.wait(5)
            assert sock.recv(100) == b""
    finally:
        server.close()


def test_the_responder_pongs_each_ping_and_a_watchers_acknowledgment_moves_the_deadline():
    log, contacts = ContactLog(fence_after=1.0), []
    times = iter([10.0, 11.0, 12.0])
    responder = Responder(log, host="127.0.0.1", on_contact=contacts.append, clock=lambda: next(times))
    try:
        with _client(("127.0.0.1", responder.port)) as sock:
            reader = sock.makefile("rb")
            sock.sendall(ping(7, 0))
            first = parse(reader.readline().rstrip(b"\n"))
            assert (first.kind.value, first.round) == ("pong", 7)
            assert log.deadline(7) == 11.0  # first answer's send time + fence_after
            sock.sendall(ping(7, first.number))  # acknowledges the first answer (sent at 10.0)
            second = parse(reader.readline().rstrip(b"\n"))
            assert second.number > first.number
            sock.sendall(ping(7, second.number))  # acknowledges the second (sent at 11.0): deadline moves
            reader.readline()
            assert log.deadline(7) == 12.0
            sock.sendall(bye(7))
            assert reader.readline() == b"", "a goodbye ends the connection"
        assert log.deadline(7) is None, "a watcher's goodbye releases its round"
        assert contacts[0] == 7 and contacts[-1] == 7
    finally:
        responder.close()


def test_the_responder_drops_a_connection_that_speaks_no_probe():
    log = ContactLog(fence_after=1.0)
    responder = Responder(log, host="127.0.0.1")
    try:
        with _client(("127.0.0.1", responder.port)) as sock:
            sock.sendall(b"GET / HTTP/1.0\n")
            assert sock.recv(100) == b""
        assert log.deadline(0) is None
    finally:
        responder.close()
