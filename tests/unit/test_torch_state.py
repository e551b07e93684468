"""torch's pickled rendezvous state read without unpickling (``rendezvous.torchrun.torchstate``):
its fields come out of the opcodes; a pickle that would run code is read as data and refused."""

from __future__ import annotations

import os
import pickle
from datetime import datetime, timezone

import pytest

from rendezvous.errors import RendezvousStateError
from rendezvous.torchrun.torchstate import is_torch_state, read_torch_state, walk


class _RendezvousState:  # the shape of torch's, without torch
    pass


class _NodeDesc:
    def __init__(self, addr: str, pid: int, local_id: int) -> None:
        self.addr, self.pid, self.local_id = addr, pid, local_id

    def __hash__(self) -> int:
        return hash((self.addr, self.pid, self.local_id))


def _state(closed: bool) -> bytes:
    state = _RendezvousState()
    a, b, c = _NodeDesc("10.0.0.1", 11, 0), _NodeDesc("10.0.0.2", 22, 0), _NodeDesc("10.0.0.3", 33, 1)
    beats = {a: datetime(2026, 1, 1, tzinfo=timezone.utc), c: datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)}
    state.__dict__.update(round=4, complete=True, deadline=None, closed=closed, participants={a: 0, b: 1},
                          wait_list={c}, redundancy_list=set(), last_heartbeats=beats)  # fmt: skip
    return pickle.dumps(state)


def test_the_fields_of_torchs_state_are_read_from_its_opcodes():
    read = read_torch_state(_state(closed=True))
    assert (read.round, read.complete, read.closed, read.waiting, read.redundant) == (4, True, True, 1, 0)
    assert [(n.addr, n.pid, n.rank) for n in read.participants] == [("10.0.0.1", 11, 0), ("10.0.0.2", 22, 1)]
    assert is_torch_state(_state(closed=False)) and not is_torch_state(b'{"round": 1}')
    assert sorted((n.addr, n.pid) for n in read.beating) == [("10.0.0.1", 11), ("10.0.0.3", 33)]  # b: dropped
    assert read.last_heartbeat == datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)


class _Runs:
    def __reduce__(self):
        return (os.system, ("touch /tmp/elastic-torchstate-ran",))


def test_a_pickle_that_would_run_code_is_read_as_data_and_refused(tmp_path):
    if os.path.exists("/tmp/elastic-torchstate-ran"):
        os.unlink("/tmp/elastic-torchstate-ran")
    hostile = pickle.dumps(_Runs())
    assert walk(hostile) == {"__class__": "posix.system"}  # a name, never looked up or called
    with pytest.raises(RendezvousStateError, match="not torch's rendezvous state"):
        read_torch_state(hostile)
    assert not os.path.exists("/tmp/elastic-torchstate-ran")
    with pytest.raises(RendezvousStateError, match="could not be read"):
        read_torch_state(b"\x80\x04not a pickle")
