"""The pre-flight check's program, run on each node of a round in its workers' environment before
the workers start (``python -m launcher.preflight.probe``, forked from the warm interpreter when
there is one): a matmul, then an all-reduce in pairs in two passes (``pairs``), gloo on CPU and
NCCL on GPU, met through the round's c10d store that group rank 0's agent serves. Every node
writes its figures to the store and takes everyone's as group rank 0 saw them (``_share``: one view
for all, however late a node wrote), so every node pairs alike and judges alike (``pairs.judge``);
it writes the figures and the findings as JSON to the file its agent named.

Its settings come in ``ELASTIC_PREFLIGHT`` (JSON): round, rank (group rank), nodes, addr, port
(the store), mib (the all-reduce's size), timeout (seconds for each wait), out (the result file).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

from launcher.preflight.pairs import ENV, confirm_pass, first_pass, judge, second_pass

__all__ = ["main"]

PAIR_TIMEOUT = 5.0  # seconds a node waits for its partner to meet it (a healthy pair meets in well under 1)
WINDOW = 0.2  # seconds the matmuls are timed over: two of a throttled node's 100 ms periods, as a step sees them
PAIR_WINDOW = 0.15  # seconds each pair's all-reduces are timed over (a pass times every pair at once)
MOST = 400  # all-reduces a pair times at most (its partners agree on the count)
AGREE_SLACK = 5.0  # seconds a node waits for rank 0's figures beyond rank 0's own wait for everyone's


def own_seconds() -> float:
    """This thread's wall clock less its wait for a CPU (``/proc/thread-self/schedstat``'s run-queue
    delay): a node stopped or throttled part of the time (a paused VM, a cgroup's CPU quota, a
    shared host) is slow by that much; one whose cores other work shares is not."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            waited = int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        waited = 0.0
    return time.perf_counter() - waited


def _matmul(torch, device) -> float:
    """The mean time of square matmuls, done back to back for ``WINDOW`` seconds after a warm-up:
    1024 on a GPU (synchronized), 384 on CPU in one thread; on the node's own clock (``own_seconds``).
    Sustained, not a best case: a node at 30 % of its speed is fast for 30 ms at a time."""
    size = 1024 if device.type == "cuda" else 384
    if device.type != "cuda":
        torch.set_num_threads(1)  # no thread pool spinning in the figure
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    (a @ b).sum().item()
    count, started = 0, own_seconds()
    while count < 3 or own_seconds() - started < WINDOW:
        (a @ b).sum().item()
        count += 1
    return (own_seconds() - started) / count


def _pair_group(dist, store, rank: int, device):
    """A process group of two on ``store``, made directly (not the default group: nothing of it is
    left in torch's globals, so a pair that failed leaves the next one as it would be)."""
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, 2)
    return dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=PAIR_TIMEOUT))


def _pair_time(dist, torch, store, key: str, me: int, pair: tuple[int, int], mib: int, device):
    """Seconds of one all-reduce of ``mib`` MiB with the partner: the mean of as many back to back as
    fill ``PAIR_WINDOW`` seconds (the partners agree on the count: the larger of their wishes, after a
    warm-up), on the node's own clock; None: failed."""
    try:
        prefixed = dist.PrefixStore(key, store)
        prefixed.set_timeout(timedelta(seconds=PAIR_TIMEOUT))
        group = _pair_group(dist, prefixed, pair.index(me), device)
        tensor = torch.ones(mib * 2**20 // 4, device=device)
        started = own_seconds()
        group.allreduce([tensor]).wait()
        tensor[0].item()
        wish = torch.tensor(
            [min(MOST, max(3, int(PAIR_WINDOW / max(own_seconds() - started, 1e-4)) + 1))], device=device
        )
        largest = dist.AllreduceOptions()
        largest.reduceOp = dist.ReduceOp.MAX
        group.allreduce([wish], largest).wait()
        count, started = int(wish.item()), own_seconds()
        for _ in range(count):
            group.allreduce([tensor]).wait()
        tensor[0].item()
        return (own_seconds() - started) / count
    except Exception as exc:  # noqa: BLE001 -- any failure of the pair is the finding
        print(f"preflight: pair {pair} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _run_pass(dist, torch, store, settings: dict, number: int, slots, device) -> float | None:
    """This node's time in one pass (its first pair's), shared with and read from every node."""
    me = settings["rank"]
    mine = None
    for index, slot in enumerate(slots):
        for pair in slot:
            if me in pair:
                key = f"elastic-preflight/{settings['round']}/{number}/{index}/{pair[0]}-{pair[1]}/"
                took = _pair_time(dist, torch, store, key, me, pair, settings["mib"], device)
                mine = took if mine is None else mine
    return mine


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _read(store, key: str):
    try:
        return json.loads(store.get(key)) if store.check([key]) else None
    except Exception:  # noqa: BLE001 -- unreadable counts as missing
        return None


def _share(store, settings: dict, name: str, value) -> dict[int, float | None]:
    """Write this node's ``value`` under ``name``, and return everyone's as group rank 0 saw them
    once all wrote or its wait ran out (missing: None). Every node gets the same figures -- so the
    same next pairs and the same findings -- however late one of them wrote: a node that reads
    for itself may see a figure another node gave up on. Without rank 0's answer (it is gone), the
    node's own reading. A request or two a node when all wrote in time (the store is the agent's)."""
    prefix, rank = f"elastic-preflight/{settings['round']}/{name}/", settings["rank"]
    store.set(prefix + str(rank), json.dumps(value))
    keys = [prefix + str(r) for r in range(settings["nodes"])]
    agreed = prefix + "agreed"
    if rank == 0:
        store.set(agreed, json.dumps([_number(v) for v in _values(store, keys, settings["timeout"])]))
    seen = _values(store, [agreed], settings["timeout"] + AGREE_SLACK)[0]
    if isinstance(seen, list) and len(seen) == settings["nodes"]:
        return {r: _number(v) for r, v in enumerate(seen)}
    return {r: _number(v) for r, v in enumerate(_values(store, keys, 0.0))}


def _values(store, keys: list[str], seconds: float) -> list:
    """The JSON values at ``keys`` once all are written or ``seconds`` ran out (missing: None): one
    request for them all when all came, one each for those that did."""
    if _wait(store, keys, seconds):
        try:
            return [json.loads(raw) for raw in store.multi_get(keys)]
        except Exception:  # noqa: BLE001 -- unreadable: read one by one below
            pass
    return [_read(store, key) for key in keys]


def _wait(store, keys: list[str], seconds: float) -> bool:
    """Whether every key was written within ``seconds``."""
    try:
        store.wait(keys, timedelta(seconds=max(seconds, 0.001)))
    except Exception:  # noqa: BLE001 -- a node that never wrote counts as failed
        return False
    return True


def main() -> None:
    settings = json.loads(os.environ[ENV])
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    store = dist.TCPStore(
        settings["addr"], settings["port"], is_master=False, timeout=timedelta(seconds=settings["timeout"])
    )
    _share(store, settings, "ready", 1)  # every node past its imports: none times its matmul beside them
    started = time.monotonic()  # the check's cost: what it adds once every node could start its workers
    matmul = _share(store, settings, "matmul", _matmul(torch, device))
    first = _share(
        store, settings, "t1", _run_pass(dist, torch, store, settings, 1, first_pass(settings["nodes"]), device)
    )
    second_slots = second_pass(first)
    second = _share(store, settings, "t2", _run_pass(dist, torch, store, settings, 2, second_slots, device))
    confirming = confirm_pass(first, second)  # the same slots on every node: all share the same figures
    third = (
        _share(store, settings, "t3", _run_pass(dist, torch, store, settings, 3, confirming, device))
        if confirming
        else {}
    )
    findings = judge(first, second, matmul, third)
    result = {
        "matmul": matmul,
        "first": first,
        "second": second,
        "third": third,
        "findings": [{"rank": f.node, "kind": f.kind, "why": f.why} for f in findings],
        "seconds": round(time.monotonic() - started, 3),
    }
    with open(settings["out"] + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(settings["out"] + ".tmp", settings["out"])


if __name__ == "__main__":
    main()
