"""When a failed etcd call is worth trying again, how long each try may take, and how to say why
it failed. Pure functions: ``EtcdClient._call`` does the I/O.

A call has one time budget (``read_timeout``). Within it, tries go round the endpoints; a pass over
all of them is followed by a short backoff. The first pass splits the budget between the endpoints
(so a frozen member cannot eat all of it); each later pass gives every try twice as long, so a
slow link (a few hundred ms a round trip, a connection still being set up) still gets through.

What is retried is one table, ``ANSWERS``: each row is an etcd answer (a gRPC status code and, for
some, words of its message), whether trying again can change it, and a few words for people. The
first row that matches decides; an answer no row names is final. Retried: the endpoint is
unreachable or silent, and etcd's own "try again" answers (no leader, leader changed, request timed
out, a member's own deadline passed, too many requests), which it sends while an election runs or a
member is frozen. Final: a refused password or permission, a bad request, a compacted revision, a
lease etcd no longer has, a full database, a failed TLS handshake.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "ANSWERS",
    "Answer",
    "answer",
    "RETRYABLE_CODES",
    "is_retryable",
    "attempt_timeout",
    "backoff",
    "BACKOFF_START",
    "BACKOFF_MAX",
    "reason",
    "where",
    "unreachable_message",
]


class Answer(NamedTuple):
    """One row of the table: an answer etcd (or gRPC) gives, and what it means for a retry."""

    code: str  # a grpc.StatusCode name; "*": any code
    words: str  # lower-case words its message contains ("": any message)
    retry: bool  # True: another try (on this member or another) may succeed
    reason: str  # a few words for people ("": the code's own words)

    def matches(self, code: str, text: str) -> bool:
        return self.code in ("*", code) and self.words in text


# grpc.StatusCode names, so this module needs no gRPC import. First match wins; order matters.
ANSWERS: tuple[Answer, ...] = (
    Answer("*", "handshake failed", False, "TLS handshake failed"),  # a wrong certificate or CA fails again
    Answer("*", "database space exceeded", False, "out of space (NOSPACE alarm)"),
    Answer("*", "no leader", True, "no leader"),
    Answer("*", "leader changed", True, "leader changed"),
    Answer("*", "not leader", True, "not leader"),
    Answer("*", "request timed out", True, "request timed out"),  # also "..., possibly due to previous leader failure"
    Answer("*", "context deadline exceeded", True, "request timed out"),  # the member's own deadline (a frozen leader)
    Answer("*", "too many requests", True, "too many requests"),
    Answer("*", "unhealthy cluster", True, "unhealthy cluster"),
    Answer("*", "not capable", True, "not capable"),  # a member still starting or upgrading
    Answer("*", "raft: stopped", True, "raft: stopped"),
    Answer("*", "proposal dropped", True, "proposal dropped"),
    Answer("*", "server stopped", True, "server stopped"),  # a member shutting down
    Answer("*", "request cancelled", True, "request cancelled"),  # cancelled by the member (leader lost)
    Answer("*", "request canceled", True, "request cancelled"),
    Answer("UNAVAILABLE", "", True, ""),  # unreachable, refused, reset: another member or a later try
    Answer("DEADLINE_EXCEEDED", "", True, ""),  # no answer within the try's time
)
RETRYABLE_CODES = frozenset(a.code for a in ANSWERS if a.retry and not a.words)
_FINAL = Answer("*", "", False, "")


def answer(code: str, details: str = "") -> Answer:
    """The row of ``ANSWERS`` for an answer with gRPC status ``code`` (its name) and message ``details``."""
    text = (details or "").lower()
    return next((a for a in ANSWERS if a.matches(code, text)), _FINAL)


_UNRESOLVED = ("errors resolving", "domain name not found", "name resolution", "dns resolution", "lookup failed")

_MIN_TRY = 1.0  # seconds: the shortest try, so that a slow but working endpoint (a few 100 ms a round trip) can answer
BACKOFF_START = 0.05  # seconds: the first pause after a pass over every endpoint (a stream's first reconnect)
BACKOFF_MAX = 1.0  # ... doubling up to this


def is_retryable(code: str, details: str = "") -> bool:
    """Whether a call that failed with gRPC status ``code`` (its name) may succeed if tried again."""
    return answer(code, details).retry


def attempt_timeout(remaining: float, endpoints: int, attempt: int) -> float:
    """How long try number ``attempt`` (0-based) may take, with ``remaining`` seconds of budget left.

    First pass: an equal share of what is left for each endpoint not yet tried (at least
    ``_MIN_TRY``). Later passes: twice the previous pass's share, never more than what is left.
    """
    if remaining <= 0:
        return 0.0
    if endpoints <= 1:
        return remaining
    first_pass = attempt < endpoints
    if first_pass:
        share = remaining / (endpoints - attempt)
    else:
        share = remaining / endpoints * 2 ** (attempt // endpoints)
    return min(remaining, max(share, _MIN_TRY))


def backoff(attempt: int, endpoints: int) -> float:
    """Seconds to wait before try ``attempt`` (0-based): none within a pass, growing between passes."""
    if attempt == 0 or attempt % max(endpoints, 1):
        return 0.0
    passes = attempt // max(endpoints, 1)
    return min(BACKOFF_START * 2 ** (passes - 1), BACKOFF_MAX)


_REFUSED = re.compile(r"connection refused", re.IGNORECASE)


def reason(code: str, details: str = "", waited: float | None = None) -> str:
    """A few words for people: ``connection refused``, ``no answer within 1.2 s``, ``no leader``."""
    text = (details or "").strip()
    lowered = text.lower()
    if _REFUSED.search(text):
        return "connection refused"
    if code == "DEADLINE_EXCEEDED":
        return f"no answer within {waited:.1f} s" if waited is not None else "no answer"
    row = answer(code, text)
    if row.reason:
        return row.reason
    if any(marker in lowered for marker in _UNRESOLVED):
        return "the host name does not resolve"
    if "ssl" in lowered or "handshake" in lowered:
        return "TLS handshake failed"
    if "socket closed" in lowered or "connection reset" in lowered or "broken pipe" in lowered:
        return "connection closed"
    if code == "UNAVAILABLE":
        return "unavailable"
    return f"{code}: {text}" if text else code


def where(failures: dict[str, str]) -> str:
    """``h1:2379 (connection refused), h2:2379 (no answer within 1.7 s)``"""
    return ", ".join(f"{endpoint} ({why})" for endpoint, why in failures.items())


def unreachable_message(failures: dict[str, str], attempts: int, spent: float) -> str:
    """The one line a RendezvousConnectionError says: where, why, and how long was really spent."""
    tries = "once" if attempts == 1 else f"{attempts} times"
    return f"cannot reach etcd at {where(failures)}; tried {tries} over {spent:.1f} s"
