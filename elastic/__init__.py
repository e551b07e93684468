"""The small public API for user code: reading a job's rendezvous state."""

from .jobstate import JobView, NodeView, get_state

__all__ = ["JobView", "NodeView", "get_state"]
