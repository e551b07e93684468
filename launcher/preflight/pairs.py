"""The pre-flight check's plan and verdict (pure): which nodes pair up in each pass, and which
nodes the figures name faulty or slow.

Pass 1 pairs the round's nodes by group rank, (0, 1), (2, 3), ...; pass 2 pairs the fastest of
pass 1 with the slowest, the second fastest with the second slowest, and so on (DLRover's two
rounds), so that a slow node meets a fast partner and a fast node a slow one. With an odd count the
node left over pairs with the first node of the pass in a slot of its own, after the others. A node
whose pair test failed in both passes is *faulty*; one whose pair took more than ``SLOW`` times the
median of the pass in both passes (with two different partners), or whose matmul took more than
``SLOW`` times the median matmul, is *slow* -- the median of the faster half of the times, so that
up to half the nodes can be slow and still be told apart. A node slow in both passes meets a third
partner, one of the nodes found fast, in a confirming pass (``confirm_pass``), and is named only if
it is slow there too: a node leaves the job for good on the finding, and a stall of a fraction of a
second (another process's burst on its cores) can cover both passes, not a third one after them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SLOW", "ENV", "Pair", "first_pass", "second_pass", "confirm_pass", "Finding", "judge"]

SLOW = 2.0  # times the median: slower is a straggler
FLOOR = 0.001  # seconds a matmul must also exceed the median by: below it, clock noise
ENV = "ELASTIC_PREFLIGHT"  # the check's settings for its program (``probe``), as JSON

Pair = tuple[int, int]


def _slots(order: Sequence[int]) -> list[list[Pair]]:
    """``order`` paired from both ends inward; an odd one out pairs with ``order[0]`` in a slot after."""
    pairs = [(order[i], order[-1 - i]) for i in range(len(order) // 2)]
    slots = [sorted(tuple(sorted(p)) for p in pairs)]
    if len(order) % 2:
        slots.append([tuple(sorted((order[len(order) // 2], order[0])))])
    return [slot for slot in slots if slot]


def first_pass(nodes: int) -> list[list[Pair]]:
    """Pass 1's slots: (0, 1), (2, 3), ...; with an odd count, (0, last) after them."""
    if nodes < 2:
        return []
    slots = [[(i, i + 1) for i in range(0, nodes - 1, 2)]]
    if nodes % 2:
        slots.append([(0, nodes - 1)])
    return slots


def second_pass(times: Mapping[int, float | None]) -> list[list[Pair]]:
    """Pass 2's slots from pass 1's time of each node (None: its test failed, the slowest of all)."""
    if len(times) < 2:
        return []
    order = sorted(times, key=lambda node: (times[node] is None, times[node] or 0.0, node))
    return _slots(order)


@dataclass(frozen=True)
class Finding:
    """What the pre-flight check found of one node."""

    node: int  # group rank
    kind: str  # "faulty" or "slow"
    why: str

    def line(self) -> str:
        return f"group rank {self.node} is {self.kind}: {self.why}"


def _median(values: Sequence[float | None]) -> float | None:
    """The median of the faster half of the times: in a pass both nodes of a pair share its time, so
    one slow node makes two slow times, and a plain median of four is halfway to the slow one."""
    done = sorted(v for v in values if v is not None)
    return statistics.median(done[: (len(done) + 1) // 2]) if done else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _slow_pairs(first: Mapping[int, float | None], second: Mapping[int, float | None]) -> list[int]:
    """The nodes whose all-reduce took more than ``SLOW`` times the median in both passes."""
    m1, m2 = _median(list(first.values())), _median(list(second.values()))
    if not m1 or not m2:
        return []
    slow = [n for n in sorted(set(first) & set(second)) if first[n] is not None and second[n] is not None]
    return [n for n in slow if first[n] > SLOW * m1 and second[n] > SLOW * m2]


def confirm_pass(first: Mapping[int, float | None], second: Mapping[int, float | None]) -> list[list[Pair]]:
    """The confirming pass's one slot: each node slow in both passes with a node found fast (the
    fastest of pass 2 first, each partner once); none when no node was slow. A slow node left without
    a fast partner is named on the two passes alone."""
    suspects = _slow_pairs(first, second)
    if not suspects:
        return []
    fast = [n for n in second if n not in suspects and second[n] is not None and first.get(n) is not None]
    fast.sort(key=lambda n: (second[n], n))
    return [sorted(tuple(sorted(pair)) for pair in zip(suspects, fast))]


def judge(
    first: Mapping[int, float | None],
    second: Mapping[int, float | None],
    matmul: Mapping[int, float | None],
    third: Mapping[int, float | None] | None = None,
) -> list[Finding]:
    """The nodes the figures name (by group rank): faulty first, then slow. ``third``: the confirming
    pass's times; a node slow in both passes that was fast with its third partner is not named."""
    found = []
    nodes = sorted(set(first) | set(second) | set(matmul))
    m1, m2, mm = _median(list(first.values())), _median(list(second.values())), _median(list(matmul.values()))
    slow = _slow_pairs(first, second)
    for node in nodes:
        t1, t2, own = first.get(node), second.get(node), matmul.get(node)
        t3 = (third or {}).get(node)
        if t1 is None and t2 is None:
            found.append(Finding(node, "faulty", "its all-reduce failed with two different partners"))
        elif node in slow and not (t3 is not None and m2 and t3 <= SLOW * m2):
            why = f"its all-reduce took {_ms(t1)} and {_ms(t2)} against medians of {_ms(m1)} and {_ms(m2)}"
            found.append(Finding(node, "slow", why + (f", then {_ms(t3)} with a third partner" if t3 else "")))
        elif mm and own is not None and own > SLOW * mm and own - mm > FLOOR:
            found.append(Finding(node, "slow", f"its matmul took {_ms(own)} against a median of {_ms(mm)}"))
        elif mm and own is None and node in matmul:  # every node saw rank 0's figures: it reported too late
            found.append(
                Finding(node, "slow", f"its matmul was not reported within the check's wait (median {_ms(mm)})")
            )
    return sorted(found, key=lambda f: (f.kind != "faulty", f.node))
