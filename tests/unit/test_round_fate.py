"""What became of a torchrun node's round (``rendezvous.torchrun.roundfate``): closed ends the
node, a participant dropped or a round moved on asks for a new round, anything else decides nothing."""

from __future__ import annotations

from rendezvous.torchrun.roundfate import Fate, fate, lost_nodes
from rendezvous.torchrun.torchstate import TorchNode, TorchState

A, B = TorchNode("10.0.0.1", 100, 0, 0), TorchNode("10.0.0.2", 200, 0, 1)


def _state(
    *nodes: TorchNode, round: int = 0, complete: bool = True, closed: bool = False, rejoining: tuple = ()
) -> TorchState:
    beating = (*nodes, *rejoining)  # torch keeps the heartbeat of every node it has not dropped
    return TorchState(round, complete, closed, tuple(nodes), 0, 0, None, beating)


def test_a_closed_rendezvous_ends_the_node_whatever_its_round():
    assert fate(_state(A, B), _state(A, B, closed=True)) is Fate.CLOSED
    assert fate(None, _state(closed=True)) is Fate.CLOSED


def test_a_participant_dropped_from_the_round_abandons_it():
    formed = _state(A, B)
    assert fate(formed, _state(A)) is Fate.ABANDONED
    assert lost_nodes(formed, _state(A)) == [B]


def test_a_participant_that_left_the_round_to_rejoin_it_is_not_lost():
    """torch's agent restarting its workers leaves the round (its exit op) and joins the next: it is
    no participant for a while, but torch keeps its heartbeat."""
    assert fate(_state(A, B), _state(A, rejoining=(B,))) is None


def test_a_round_that_moved_on_abandoned_every_participant_of_the_old_one():
    formed = _state(A, B)
    assert fate(formed, _state(round=1, complete=False)) is Fate.ABANDONED
    assert lost_nodes(formed, _state(round=1, complete=False)) == [A, B]


def test_a_node_is_the_same_node_by_address_pid_and_local_id_not_by_rank():
    renumbered = _state(TorchNode("10.0.0.1", 100, 0, 1), TorchNode("10.0.0.2", 200, 0, 0))
    assert fate(_state(A, B), renumbered) is None
    restarted = _state(A, TorchNode("10.0.0.2", 201, 0, 1))  # another agent on the same address
    assert fate(_state(A, B), restarted) is Fate.ABANDONED


def test_nothing_is_decided_before_a_round_formed_or_on_a_state_that_cannot_be_read():
    assert fate(None, _state(A)) is None
    assert fate(_state(A, B, complete=False), _state(A)) is None
    assert fate(_state(A, B), None) is None
    assert fate(_state(A, B), _state(A, B)) is None
