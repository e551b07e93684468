"""The option values' parsers, one function an option (torchrun's meanings), beside the table that
lists the options (``launcher.options.table``): text in, a typed value out, or a ``UsageError``
naming the bad one. Pure, and light: the command's first moments use them (``launcher.cli.early``),
before its heavy imports. What the options mean together -- a job on this node alone, the c10d
line's etcd, the lines said for an ignored option -- the command line derives
(``launcher.cli.derive``)."""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.errors import UsageError

__all__ = [
    "NodeRange",
    "parse_nnodes",
    "parse_nproc_per_node",
    "expand_abbreviations",
    "worker_argv",
    "RDZV_BACKENDS",
    "NOT_HERE",
    "parse_rdzv_backend",
    "shutdown_timeout",
    "parse_std",
    "parse_ranks_filter",
    "parse_filters",
]

# c10d: torchrun's lines as they are, on an etcd hosted by the agent on the endpoint's host (launcher.hosted)
RDZV_BACKENDS = {"etcd-v3": "etcd-v3", "etcd": "etcd-v3", "etcd_v3": "etcd-v3", "etcd-v2": "etcd-v3", "c10d": "c10d"}
# torchrun's backends that need no etcd: the line that names what to use instead.
_INSTEAD = "use --standalone for one node, or give --rdzv-endpoint the host:port of an etcd"
NOT_HERE = {
    "static": "static rendezvous needs --node-rank/--master-addr on every node; " + _INSTEAD,
}


@dataclass(frozen=True)
class NodeRange:
    min_nodes: int
    max_nodes: int


def parse_nnodes(text: str) -> NodeRange:
    """``N`` or ``MIN:MAX`` with 1 <= MIN <= MAX."""
    value = str(text).strip()
    lo, sep, hi = value.partition(":")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise UsageError(f"--nnodes must be N or MIN:MAX (whole numbers), not {text!r}")
    low, high = int(lo), int(hi) if sep else int(lo)
    if low < 1:
        raise UsageError(f"--nnodes {text!r}: the number of nodes must be at least 1")
    if high < low:
        raise UsageError(f"--nnodes {text!r}: MIN ({low}) is larger than MAX ({high})")
    return NodeRange(low, high)


def _cpu_count() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroups), as torchrun counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _gpu_count(installed: int | None = None, visible: str | None = None) -> int:
    """GPUs that exist and are visible: CUDA_VISIBLE_DEVICES counts up to its first entry that is
    not an installed device (as CUDA does), never more than are installed. No torch import."""
    if installed is None:
        installed = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return installed
    count = 0
    for entry in (e.strip() for e in visible.split(",")):
        valid = entry.isdigit() and int(entry) < installed or entry.startswith(("GPU-", "MIG-"))
        if not valid:
            break
        count += 1
    return min(count, installed)


def _xpu_count(root: str = "/sys/class/drm") -> int:
    """Intel GPUs (XPUs) that exist: DRM cards of vendor 0x8086 driven by i915 or xe. No torch import."""
    count = 0
    for card in glob.glob(os.path.join(root, "card[0-9]*")):
        if "-" in os.path.basename(card):
            continue  # a connector (card0-DP-1), not a device
        try:
            with open(os.path.join(card, "device", "vendor")) as handle:
                vendor = handle.read().strip()
            driver = os.path.basename(os.readlink(os.path.join(card, "device", "driver")))
        except OSError:
            continue
        count += vendor == "0x8086" and driver in ("i915", "xe")
    return count


def parse_nproc_per_node(text: str) -> int:
    """A positive number, ``cpu`` (one per CPU), ``gpu`` (one per visible GPU), ``xpu`` (one per
    Intel GPU) or ``auto`` (GPUs, else XPUs, else CPUs)."""
    value = str(text).strip().lower()
    if value.isdigit():
        if int(value) < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, not {text!r}")
        return int(value)
    if value == "cpu":
        return _cpu_count()
    if value == "gpu":
        count = _gpu_count()
        if count == 0:
            raise UsageError("--nproc-per-node gpu: no GPU is visible on this node")
        return count
    if value == "xpu":
        count = _xpu_count()
        if count == 0:
            raise UsageError("--nproc-per-node xpu: no XPU is visible on this node")
        return count
    if value == "auto":
        return _gpu_count() or _xpu_count() or _cpu_count()
    raise UsageError(f"--nproc-per-node must be a number, cpu, gpu, xpu or auto, not {text!r}")


def expand_abbreviations(argv: Sequence[str], options: dict[str, str], takes_value: set[str]) -> list[str]:
    """argparse's unique-prefix abbreviations of long options, before the script (``--nproc 2``,
    ``--redirect=3``). ``options`` maps every spelling to its option's name; spellings of one option
    count as one. Ambiguous: one error naming the candidates; unknown: left for the parser to refuse."""
    out = list(argv)
    i = 0
    while i < len(out):
        token = out[i]
        if token == "--" or not token.startswith("-") or token == "-":
            break  # the script: everything after it is its own
        if not token.startswith("--"):
            short = token[:2]
            i += 2 if short in takes_value and len(token) == 2 else 1
            continue
        name, eq, value = token.partition("=")
        if name not in options:
            matches: dict[str, str] = {}
            for spelling, option in options.items():
                if spelling.startswith(name) and spelling.startswith("--"):
                    matches.setdefault(option, spelling)
            if len(matches) > 1:
                candidates = ", ".join(sorted({s for s, o in options.items() if o in matches and s.startswith(name)}))
                raise UsageError(f"ambiguous option: {name} could match {candidates}")
            if len(matches) == 1:
                name = next(iter(matches.values()))
                out[i] = name + eq + value
        i += 2 if name in takes_value and not eq else 1
    return out


def parse_rdzv_backend(name: str) -> str:
    """``etcd-v3`` for every name of it (``etcd``, and ``etcd-v2``, which runs on the v3 API),
    ``c10d``; a one-line error for torchrun's static backend and unknown names, naming the alternative."""
    key = str(name).strip().lower()
    backend = RDZV_BACKENDS.get(key)
    if backend is None:
        hint = NOT_HERE.get(key, "elastic-run supports etcd-v3 (aliases: etcd, etcd-v2) and c10d")
        raise UsageError(f"unknown --rdzv-backend {name!r}: {hint}")
    return backend


_RUN_PATH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def worker_argv(
    script: str,
    args: Sequence[str],
    *,
    module: bool = False,
    no_python: bool = False,
    run_path: bool = False,
    python: str = sys.executable,
) -> list[str]:
    """The worker command line, as torchrun builds it (``python -u script args``, or ``-m``, ...)."""
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if run_path and (module or no_python):
        raise UsageError("--run-path cannot be combined with -m/--module or --no-python")
    if no_python:
        if shutil.which(script) is None:
            raise UsageError(f"--no-python: {script!r} is not an executable file or a command on PATH")
        return [script, *args]
    if module:
        if not script or script.startswith("-"):
            raise UsageError(f"-m/--module needs a module name, not {script!r}")
        return [python, "-u", "-m", script, *args]
    if not os.path.isfile(script):
        raise UsageError(f"training script {script!r} does not exist")
    if run_path:
        return [python, "-u", "-c", _RUN_PATH, script, *args]
    return [python, "-u", script, *args]


def shutdown_timeout(value: float | None) -> float:
    """--shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s (torchrun's rule)."""
    if value is not None:
        return value
    text = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UsageError(f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a number of seconds >= 0, not {text!r}")
    return seconds


def parse_std(value: str | int | None, option: str) -> dict[int, int] | int:
    """``3`` -> 3 for every rank; ``0:1,1:2`` -> {0: 1, 1: 2} (ranks not named: 0)."""
    if value is None or value == "":
        return 0  # Std.NONE: nothing redirected
    text = str(value).strip()

    def level(item: str) -> int:
        if item.strip() not in {"0", "1", "2", "3"}:
            raise UsageError(f"{option} must be 0, 1, 2 or 3 (or LOCAL_RANK:LEVEL,...), not {text!r}")
        return int(item)

    if ":" not in text:
        return level(text)
    mapping: dict[int, int] = {}
    for part in text.split(","):
        rank, sep, lvl = part.partition(":")
        if not sep or not rank.strip().isdigit():
            raise UsageError(f"{option} must be 0, 1, 2 or 3 (or LOCAL_RANK:LEVEL,...), not {text!r}")
        mapping[int(rank)] = level(lvl)
    return mapping


def parse_ranks_filter(value: str | None) -> frozenset[int] | None:
    if value is None or value.strip() == "":
        return None
    ranks = set()
    for part in value.split(","):
        if not part.strip().isdigit():
            raise UsageError(f"--local-ranks-filter takes local ranks like 0,2, not {value!r}")
        ranks.add(int(part))
    return frozenset(ranks)


def parse_filters(value: str | None) -> tuple[str, ...]:
    """torchrun's comma-separated filter list; ``,,`` is a literal comma. Empty: no filter."""
    if not value:
        return ()
    marker = "\x00"
    return tuple(item.replace(marker, ",") for item in value.replace(",,", marker).split(","))
