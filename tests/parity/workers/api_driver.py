"""Runs one launch API case in a process of its own, as a notebook or a framework would, and prints
one JSON line: the per-rank results, or the error -- for torch's elastic_launch or ours.

    api_driver.py torch|ours CASE_JSON

CASE_JSON: {"config": {LaunchConfig fields}, "entrypoint": "fn:NAME" | "main:NAME" | "cmd:PATH", "args": [...],
"times": 1}. After the launches it reports what the process has left: child processes, threads,
environment variables that changed.
"""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import api_fns  # noqa: E402


def rank_squared():
    """A function of the caller's own __main__ (as a notebook or a script defines one)."""
    return int(os.environ["RANK"]) ** 2


def main() -> None:
    side, case = sys.argv[1], json.loads(sys.argv[2])
    if side == "torch":
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    else:
        from elastic.launch import LaunchConfig, elastic_launch
    kind, name = case["entrypoint"].split(":", 1)
    entrypoint = {"fn": lambda: getattr(api_fns, name), "main": lambda: globals()[name]}.get(kind, lambda: name)()
    env_before, threads_before = dict(os.environ), threading.active_count()
    out = {"results": []}
    try:
        for _ in range(case.get("times", 1)):
            results = elastic_launch(LaunchConfig(**case["config"]), entrypoint)(*case.get("args", []))
            out["results"].append({str(rank): value for rank, value in results.items()})
    except Exception as exc:  # noqa: BLE001 -- reported to the test
        failures = getattr(exc, "failures", {}) or {}
        out["error"] = type(exc).__name__
        out["message"] = str(exc)
        out["failures"] = {str(rank): {"exitcode": getattr(f, "exitcode", None)} for rank, f in failures.items()}
    import psutil

    out["children"] = [p.pid for p in psutil.Process().children(recursive=True)]
    out["extra_threads"] = threading.active_count() - threads_before
    out["env_changed"] = sorted(k for k in set(env_before) | set(os.environ) if env_before.get(k) != os.environ.get(k))
    print("RESULT " + json.dumps(out, default=list), flush=True)


if __name__ == "__main__":
    main()
