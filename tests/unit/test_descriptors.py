"""Each descriptor has one owner and is closed once: the wake pipe of a selector thread is closed by
that thread after its loop stopped, and a wake-up after that writes nothing -- not even into the
file that has since been given the same descriptor number. The close-down runs while the threads
are busy (a pipe flooded by a writer, connections sending lines), many times over."""

from __future__ import annotations

import os
import socket
import threading
import time

from launcher.output import LogPump
from launcher.selector.lineserver import LineServer
from launcher.selector.waker import Waker

ROUNDS = 150


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_a_wake_after_the_owner_closed_the_pipe_writes_nothing_into_the_file_that_took_its_number(tmp_path):
    waker = Waker()
    write_end = waker._write_end  # noqa: SLF001 -- the number the kernel gives out again once freed
    waker.close()
    path = tmp_path / "victim"
    path.touch()
    reopened = [os.open(path, os.O_WRONLY) for _ in range(2)]  # the two lowest free numbers: the pipe's
    try:
        assert write_end in reopened
        waker.wake()
        waker.close()  # a second close closes nothing
        os.fstat(reopened[0])
        os.fstat(reopened[1])
    finally:
        for fd in reopened:
            os.close(fd)
    assert path.read_bytes() == b""


def test_wakes_from_many_threads_while_the_owner_closes_never_raise():
    for _ in range(ROUNDS):
        waker = Waker()
        errors = []

        def hammer(w=waker, errors=errors):
            try:
                for _ in range(200):
                    w.wake()
            except OSError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        waker.drain()
        waker.close()
        for thread in threads:
            thread.join()
        assert errors == []


def _flood(fd: int, stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            os.write(fd, b"a line of output from a busy worker\n" * 50)
    except OSError:
        pass  # the pump closed the read end
    finally:
        os.close(fd)


def test_the_pump_closes_while_its_pipes_are_flooded_with_no_error_and_no_descriptor_left(tmp_path):
    before = _open_fds()
    for _ in range(ROUNDS):
        pump = LogPump()
        stops, writers = [], []
        with open(tmp_path / "log", "wb") as log:
            for _ in range(2):
                read_end, write_end = os.pipe()
                pump.add(read_end, "[0]: ", None, open(tmp_path / "copy", "ab"))
                stop = threading.Event()
                writer = threading.Thread(target=_flood, args=(write_end, stop))
                writer.start()
                stops.append(stop)
                writers.append(writer)
            pump.close(timeout=0.0)  # busy pipes: the drain gives up at once and the thread is told to stop
            late_r, late_w = os.pipe()
            pump.add(late_r, "", log, None)  # after close: closed by the caller, not leaked
            os.close(late_w)
        for stop, writer in zip(stops, writers):
            stop.set()
            writer.join(timeout=5)
    time.sleep(0.1)
    assert _open_fds() - before == set()


def test_a_line_server_closes_while_clients_send_with_no_descriptor_left():
    before = _open_fds()
    for _ in range(ROUNDS // 3):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        server = LineServer(listener, lambda connection, line: connection.send(b"ok\n"), name="test-lines")
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        for client in clients:
            client.sendall(b"ping\n" * 20)
        server.close()
        for client in clients:
            client.close()
    assert _open_fds() - before == set()
