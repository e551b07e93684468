"""Reading a job's rendezvous state: the library view (see rendezvous.rounds.view)."""

from rendezvous.rounds.view import JobView, NodeView, get_state

__all__ = ["JobView", "NodeView", "get_state"]
