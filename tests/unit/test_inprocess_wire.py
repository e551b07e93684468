"""The in-process control channel: its wire (both ends' one module) and the agent's host of it, with
real Unix sockets standing in for the workers (what ``elastic.inprocess`` sends and reads)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from launcher.inprocess import wire
from launcher.inprocess.host import InprocessHost
from launcher.inprocess.keeper import Keeper


@pytest.mark.parametrize(
    "message, decode",
    [(wire.Hello(4242), wire.to_agent), (wire.Parked(), wire.to_agent), (wire.Stop(), wire.to_worker),
     (wire.Go({"RANK": "3", "WORLD_SIZE": "4"}), wire.to_worker)],
)  # fmt: skip
def test_every_message_reads_back_as_itself(message, decode):
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message
    assert decode(line.rstrip(b"\n")) == message  # the line server hands lines over without their end


@pytest.mark.parametrize(
    "line, decode",
    [(b"hello", wire.to_agent), (b"hello me", wire.to_agent), (b"hello -1", wire.to_agent),
     (b"parked now", wire.to_agent), (b"stop", wire.to_agent), (b"\xff\xfe", wire.to_agent),
     (b"go {}", wire.to_agent), (b"hello 12", wire.to_worker), (b"go [1, 2]", wire.to_worker),
     (b'go {"RANK": 3}', wire.to_worker), (b"go {not json", wire.to_worker), (b"stop now", wire.to_worker),
     (b"", wire.to_worker)],
)  # fmt: skip
def test_a_line_that_is_no_message_for_its_reader_is_none(line, decode):
    assert decode(line) is None


class Worker:
    """A worker's end: says hello, then answers stop with parked (unless told not to)."""

    def __init__(self, path: str, pid: int, parks: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.sock.sendall(wire.encode(wire.Hello(pid)))
        self.heard: list[object] = []
        self._file = self.sock.makefile("rb")
        self._parks = parks
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            for line in self._file:
                message = wire.to_worker(line)
                self.heard.append(message)
                if isinstance(message, wire.Stop) and self._parks:
                    self.sock.sendall(wire.encode(wire.Parked()))
        except OSError:
            pass


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_host_parks_the_workers_that_answer_and_resumes_them_with_the_next_rounds_environment(tmp_path):
    host = InprocessHost(str(tmp_path))
    try:
        assert host.env() == {wire.ENV: host.path}
        parking, silent = Worker(host.path, 101), Worker(host.path, 102, parks=False)
        assert _until(lambda: host.connected(101) and host.connected(102))
        assert host.heard_from([101]) and host.heard_from([999, 102]) and not host.heard_from([999])
        started = time.monotonic()
        assert host.park([101, 102, 103], grace=1.0) == {101}  # 102 never answers, 103 never said hello
        assert 0.9 <= time.monotonic() - started < 5  # it waited its grace for 102, no longer
        assert host.resume(101, {"RANK": "1"})
        assert _until(lambda: wire.Go({"RANK": "1"}) in parking.heard)
        assert parking.heard[0] == wire.Stop() and silent.heard == [wire.Stop()]
        assert not host.resume(103, {"RANK": "1"})  # never connected: nothing to resume
    finally:
        host.close()


def test_a_worker_that_hangs_up_is_no_longer_connected_but_was_heard_from(tmp_path):
    host = InprocessHost(str(tmp_path))
    try:
        worker = Worker(host.path, 201)
        assert _until(lambda: host.connected(201))
        worker.sock.shutdown(socket.SHUT_RDWR)  # its makefile() holds the descriptor: hang up itself
        assert _until(lambda: not host.connected(201))
        assert host.heard_from([201])  # the group still knows it ran under elastic.inprocess
        assert host.park([201], grace=0.2) == set() and not host.resume(201, {"RANK": "0"})
    finally:
        host.close()


class _Process:
    def __init__(self, pid: int, code: int | None = None) -> None:
        self.pid, self._code = pid, code

    def poll(self) -> int | None:
        return self._code


class _Spec:
    def __init__(self, local_rank: int) -> None:
        self.local_rank = local_rank


class _Kept:
    def __init__(self, local_rank: int, pid: int, code: int | None = None) -> None:
        self.spec, self.process = _Spec(local_rank), _Process(pid, code)


def test_the_keeper_keeps_the_workers_that_parked_and_resumes_each_by_local_rank(tmp_path):
    host = InprocessHost(str(tmp_path))
    try:
        clients = [Worker(host.path, 301), Worker(host.path, 302, parks=False), Worker(host.path, 303)]
        assert _until(lambda: all(host.connected(pid) for pid in (301, 302, 303)))
        workers = [_Kept(0, 301), _Kept(1, 302), _Kept(2, 303), _Kept(3, 304, code=1)]  # 304: dead, never said hello
        keeper = Keeper(host)
        assert keeper.runs_under(workers[3:]) is False and keeper.runs_under(workers)
        assert keeper.park(workers, grace=0.5, spare=[2]) == [workers[0]]  # 1 silent, 2 spare, 3 dead
        error_file = tmp_path / "error.json"
        error_file.write_text("{}")  # the last round's: gone before the worker goes on
        assert keeper.resume(0, str(error_file), {"RANK": "4"}) is workers[0] and not error_file.exists()
        assert _until(lambda: wire.Go({"RANK": "4"}) in clients[0].heard)
        assert keeper.resume(1, str(error_file), {"RANK": "5"}) is None  # never parked: started afresh
        assert keeper.release() == [] and keeper.kept == {}
    finally:
        host.close()


def test_a_kept_worker_that_died_is_not_resumed_and_is_released_to_be_ended(tmp_path):
    host = InprocessHost(str(tmp_path))
    try:
        Worker(host.path, 401)
        assert _until(lambda: host.connected(401))
        worker = _Kept(0, 401)
        keeper = Keeper(host)
        assert keeper.park([worker], grace=2.0) == [worker]
        worker.process._code = -9  # it died while parked
        assert keeper.resume(0, str(tmp_path / "none"), {"RANK": "0"}) is None
        assert keeper.release() == [worker]
    finally:
        host.close()
    assert Keeper(None).park([worker], grace=1.0) == [] and not Keeper(None).runs_under([worker])
