"""elastic-run against torchrun, side by side in one run (torchrun only when torch is installed).

    python bench/launch.py [--repeat 3] [--agents 16]

1. wall time of `--standalone --nproc-per-node 2` on a trivial script;
2. K agents x 1 worker on one rendezvous: launch to every worker started (torchrun: c10d backend);
3. kill -9 of one of 3 agents (--nnodes 2:3): kill to the survivors' workers restarted;
4. a worker crash: crash to the workers restarted (--max-restarts 1);
5. agent RSS (MB) while its workers run.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rendezvous import EtcdServer  # noqa: E402
from rendezvous.etcd.server import free_port  # noqa: E402

BIN = os.path.dirname(sys.executable)
WORKER = """
import os, sys, time
out = sys.argv[1]
tag = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{os.environ['WORLD_SIZE']}-{os.environ['RANK']}-{os.getpid()}"
open(os.path.join(out, tag), "w").write(str(time.time()))
if len(sys.argv) > 2 and sys.argv[2] == "crash" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(0.5)
    open(os.path.join(out, "crashed"), "w").write(str(time.time()))
    sys.exit(1)
if len(sys.argv) > 2 and sys.argv[2] != "crash":
    time.sleep(float(sys.argv[2]))
"""


def have_torch() -> bool:
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError:
        return False
    return True


def ours(args: list[str]) -> list[str]:
    return [os.path.join(BIN, "elastic-run"), *args]


def torchrun(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def spawn(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def wait_files(out: str, pattern: str, count: int, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(glob.glob(os.path.join(out, pattern))) >= count:
            return time.monotonic()
        time.sleep(0.01)
    return None


def stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()


def standalone(launcher, script: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        out = tempfile.mkdtemp()
        started = time.perf_counter()
        subprocess.run(
            launcher(["--standalone", "--nproc-per-node", "2", script, out]),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - started)
        shutil.rmtree(out)
    return statistics.median(times)


def rdzv_args(kind: str, endpoint: str, nnodes: str, extra: list[str] = ()) -> list[str]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    args = [
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
        *extra,
    ]
    if kind == "torch":
        args += ["--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=1"]
    else:
        args += ["--rdzv-conf", "last_call_timeout=1"]
    return args


def many_agents(kind: str, endpoint: str, script: str, k: int) -> float | None:
    out = tempfile.mkdtemp()
    launcher = ours if kind == "ours" else torchrun
    args = rdzv_args(kind, endpoint, str(k))
    started = time.monotonic()
    agents = [spawn(launcher(args + [script, out, "30"])) for _ in range(k)]
    try:
        done = wait_files(out, "0-*", k, 120)
        return None if done is None else done - started
    finally:
        stop(agents)
        shutil.rmtree(out)


def kill_one(kind: str, endpoint: str, script: str) -> tuple[float | None, float | None]:
    """(seconds from kill -9 to survivors' workers restarted, agent RSS MB)."""
    out = tempfile.mkdtemp()
    launcher = ours if kind == "ours" else torchrun
    args = rdzv_args(kind, endpoint, "2:3", ["--max-restarts", "3"])
    agents = [spawn(launcher(args + [script, out, "120"])) for _ in range(3)]
    try:
        if wait_files(out, "*-3-*", 3, 120) is None:
            return None, None
        time.sleep(0.5)
        rss = psutil.Process(agents[0].pid).memory_info().rss / 2**20
        killed = time.monotonic()
        agents[2].send_signal(signal.SIGKILL)
        done = wait_files(out, "*-2-*", 2, 60)  # torchrun waits for its workers to fail first
        return (None if done is None else done - killed), rss
    finally:
        stop(agents)
        shutil.rmtree(out)


def crash(kind: str, script: str) -> float | None:
    out = tempfile.mkdtemp()
    launcher = ours if kind == "ours" else torchrun
    try:
        subprocess.run(
            launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", script, out, "crash"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
        with open(os.path.join(out, "crashed")) as handle:
            crashed = float(handle.read())
        (restarted,) = glob.glob(os.path.join(out, "1-*"))
        with open(restarted) as handle:
            return float(handle.read()) - crashed
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    finally:
        shutil.rmtree(out)


def row(name: str, mine: float | None, theirs: float | None, unit: str = "s") -> None:
    def show(v):
        return f"{v:10.2f}" if v is not None else f"{'n/a':>10}"

    ratio = f"{theirs / mine:7.1f}x" if mine and theirs else f"{'':>8}"
    print(f"{name:<44} {show(mine)} {show(theirs)} {ratio}  ({unit})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--agents", type=int, default=16)
    args = parser.parse_args()
    with_torch = have_torch()
    folder = tempfile.mkdtemp()
    script = os.path.join(folder, "worker.py")
    with open(script, "w") as handle:
        handle.write(WORKER)
    print(f"{'':<44} {'elastic-run':>10} {'torchrun':>10} {'ratio':>8}")
    row(
        "standalone, 2 workers, trivial script",
        standalone(ours, script, args.repeat),
        standalone(torchrun, script, args.repeat) if with_torch else None,
    )
    with EtcdServer() as etcd:
        c10d = f"127.0.0.1:{free_port()}"
        row(
            f"{args.agents} agents x 1 worker: all workers started",
            many_agents("ours", etcd.endpoints, script, args.agents),
            many_agents("torch", c10d, script, args.agents) if with_torch else None,
        )
        mine, my_rss = kill_one("ours", etcd.endpoints, script)
        theirs, their_rss = kill_one("torch", f"127.0.0.1:{free_port()}", script) if with_torch else (None, None)
        row("kill -9 one of 3 agents: survivors restarted", mine, theirs)
        row("agent RSS while workers run", my_rss, their_rss, "MB")
    row("worker crash: workers restarted", crash("ours", script), crash("torch", script) if with_torch else None)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
