"""The job's c10d store, hosted by the agent of group rank 0: torch's TCPStore protocol
(``protocol``) served from a thread of the agent, one fresh store per round (``server``)."""

from .server import StoreHost

__all__ = ["StoreHost"]
