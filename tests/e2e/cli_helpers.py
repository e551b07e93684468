"""Running elastic-run / elastic-ctl as real processes, and reading what the probe workers wrote."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "workers", "probe.py")
BIN = os.path.dirname(sys.executable)


def tool(name: str) -> str:
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else name


def run_id() -> str:
    return f"e2e-{uuid.uuid4().hex[:10]}"


def run(args: list[str], timeout: float = 60, env: dict | None = None, tool_name: str = "elastic-run"):
    return subprocess.run(
        [tool(tool_name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [tool("elastic-run"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def agent_args(endpoints: str, rdzv_id: str, nnodes: str, nproc: int = 2, conf: str = "") -> list[str]:
    args = [
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc),
        "--rdzv-endpoint",
        endpoints,
        "--rdzv-id",
        rdzv_id,
        "--local-addr",
        "127.0.0.1",
    ]
    return args + (["--rdzv-conf", conf] if conf else [])


def wait_joined(endpoints: str, rdzv_id: str, count: int, timeout: float = 30, prefix: str = "") -> None:
    """Wait until ``count`` nodes have joined the job (their keys are in etcd): the order nodes join
    in is the order of their group ranks, which a sleep does not decide on a loaded machine."""
    from rendezvous.etcd.client import EtcdClient
    from rendezvous.job.keys import DEFAULT_KEY_PREFIX, JobKeys

    nodes = JobKeys(prefix or DEFAULT_KEY_PREFIX, rdzv_id).nodes
    with EtcdClient(endpoints, timeout=5) as client:
        wait_for(lambda: client.count_prefix(nodes) >= count, timeout, interval=0.05, what=f"{count} nodes joined")


def records(out: str, restart: int | None = None) -> dict[int, dict]:
    """rank -> what the probe wrote, for one restart count (or the latest of each rank)."""
    found: dict[int, dict] = {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        count, rank = map(int, os.path.basename(path)[:-5].split("-"))
        if restart is None or count == restart:
            with open(path) as handle:
                found[rank] = {**json.load(handle), "restart": count}
    return found


def json_records(directory: str, pattern: str, order_by: str) -> list[dict]:
    """The JSON files matching ``pattern`` in ``directory``, loaded, in ``order_by`` order; a file a
    worker is still writing (empty or cut short: not JSON yet) is left for the next look."""
    found = []
    for path in glob.glob(os.path.join(directory, pattern)):
        with open(path) as handle:
            try:
                found.append(json.load(handle))
            except ValueError:
                continue
    return sorted(found, key=lambda record: record[order_by])


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition", story=None):
    """``predicate()``'s first true value within ``timeout``; else an AssertionError naming ``what``,
    followed by ``story()`` (what was seen meanwhile) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    seen = f"\n{story()}" if story is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")


def finish(process: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = python_stacks(process.pid)  # where it was, before it is killed
        process.kill()
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # orphans still hold the pipe: that is a finding too
            output = "(its output pipe is still held open by processes it left behind)"
        raise AssertionError(f"agent did not exit within {timeout}s:\n{output}\n{stacks}") from None
    return process.returncode, output


def python_stacks(pid: int) -> str:
    """Every thread's Python stack in a live process and in each process under it, with each process's
    state (py-spy, which the [test] extra installs): where an agent that would not exit was."""
    import psutil

    spy = shutil.which(tool("py-spy"))
    if spy is None:
        return f"(no py-spy here for the stacks of process {pid})"
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return f"(process {pid} ended before its stacks were taken)"
    shown = []
    for process in tree:
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(process.pid)], capture_output=True, text=True, timeout=20)
            shown.append(f"--- {process.pid} ({process.status()}): {' '.join(process.cmdline())[:160]}")
            shown.append((dump.stdout or dump.stderr).strip()[-4000:])
        except (psutil.NoSuchProcess, subprocess.TimeoutExpired) as exc:
            shown.append(f"--- {process.pid}: no stacks ({type(exc).__name__})")
    return "\n".join(shown)
