"""The pre-flight check (``--preflight``): before a round with a new node starts its workers, the
round's nodes time a matmul and an all-reduce in pairs, in two passes (``pairs``, pure), by a
program run in the workers' environment (``probe``); the agent's side is ``gate``."""

from .gate import Preflight, Verdict
from .pairs import Finding

__all__ = ["Preflight", "Verdict", "Finding"]
