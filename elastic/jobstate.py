"""Reading a job's rendezvous state: the library view (see rendezvous.view)."""

from rendezvous.view import JobView, NodeView, get_state

__all__ = ["JobView", "NodeView", "get_state"]
