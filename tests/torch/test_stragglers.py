"""Straggler scores end to end (real agents, real etcd, gloo on CPU): a rank slowed on one node --
its worker SIGSTOPped 60 ms of every 100 ms -- is named a straggler within 30 s by its own node, and
no healthy rank is; with --replace-stragglers and a hot spare waiting, the slow node steps out, the
spare takes its place with no restart used, and the job steps at its healthy rate again."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time

from tests.e2e.cli_helpers import agent_args, finish, run, run_id, start, wait_for

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "paced.py")


class Slowdown:
    """A process stopped ``stopped`` of every ``period`` seconds, on a thread, until ``stop()``."""

    def __init__(self, pid: int, stopped: float = 0.06, period: float = 0.1) -> None:
        self.pid, self._stopped, self._period = pid, stopped, period
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self._stopped)
                os.kill(self.pid, signal.SIGCONT)
                time.sleep(self._period - self._stopped)
        except ProcessLookupError:
            pass  # its round ended and it with it

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def workers(out: str) -> list[dict]:
    """Each worker process's header and step times, in start order."""
    found = []
    for path in glob.glob(os.path.join(out, "steps-*.txt")):
        with open(path) as handle:
            lines = handle.read().splitlines()
        if lines:
            try:
                header = json.loads(lines[0])
            except ValueError:
                continue  # written as we read
            found.append({**header, "steps": [float(t) for t in lines[1:] if t.strip()]})
    return sorted(found, key=lambda w: w["steps"][0] if w["steps"] else float("inf"))


def rate(steps: list[float], since: float, until: float) -> float:
    inside = [t for t in steps if since <= t <= until]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) > 2 else 0.0


def history(endpoints: str, rdzv_id: str) -> list[dict]:
    shown = run(["history", "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl")
    return json.loads(shown.stdout) if shown.returncode == 0 else []


def _agents(endpoints: str, rdzv_id: str, out: str, count: int, *extra: str):
    """``count`` agents; with --replace-stragglers their workers train a DDP model kept until main()
    returns, as the tutorials do: PyTorch's teardown can then deadlock at exit (gloo's thread waits for
    the GIL the main thread holds while it frees the model), which the agent ends after
    --exit-stuck-timeout seconds of doing nothing -- 10 here, not the default 60, to keep the test short."""
    args = agent_args(endpoints, rdzv_id, "3", nproc=1, conf="last_call_timeout=1") + list(extra)
    ddp = "--replace-stragglers" in extra
    args += ["--exit-stuck-timeout", "10"] if ddp else []
    return [start([*args, WORKER, out, *(["--ddp"] if ddp else [])]) for _ in range(count)]


def _running(out: str, ranks: int, restart_of=lambda w: True) -> list[dict]:
    return wait_for(
        lambda: (
            (found := [w for w in workers(out) if restart_of(w) and len(w["steps"]) > 5])
            and len(found) >= ranks
            and found
        ),
        90,
        interval=0.5,
        what=f"{ranks} workers stepping",
    )


def test_a_slowed_rank_is_named_a_straggler_within_30_s_by_its_node_and_no_healthy_rank_is(etcd_endpoints, tmp_path):
    out, rdzv_id = str(tmp_path), run_id()
    agents = _agents(etcd_endpoints, rdzv_id, out, 3)
    try:
        slow = next(w for w in _running(out, 3) if w["rank"] == 2)
        time.sleep(8.0)  # the ranks' paces settle, healthy: a false verdict would come now
        slowdown, slowed_at = Slowdown(slow["pid"]), time.monotonic()
        try:
            found = wait_for(
                lambda: [e for e in history(etcd_endpoints, rdzv_id) if e["kind"] == "straggler"],
                40,
                interval=1.0,
                what="a straggler record",
            )
            took = time.monotonic() - slowed_at
            shown = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl")
        finally:
            slowdown.stop()
        open(os.path.join(out, "stop"), "w").close()
        results = [finish(agent, 60) for agent in agents]
    finally:
        open(os.path.join(out, "stop"), "w").close()
        for agent in agents:
            agent.kill() if agent.poll() is None else None
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0, 0], outputs
    print(f"\nnamed a straggler {took:.1f} s after the slowdown began: {found[0]}")
    assert took <= 30.0
    assert [(e["rank"], e["local_rank"]) for e in found] == [(2, 0)], found
    assert 0.0 < found[0]["score"] < 0.75, found  # 0.35-0.38 alone; 0.19 once at -n 4 (stopped on a loaded CPU)
    assert f"straggler: rank 2 on {found[0]['node']} (score {found[0]['score']})" in shown.stdout, shown.stdout
    named = [text for text in outputs if "is a straggler" in text]
    assert len(named) == 1 and "rank 2 (local rank 0) is a straggler: its own work takes" in named[0], outputs


def test_with_replace_stragglers_a_spare_takes_the_slow_nodes_place_and_the_job_steps_at_its_healthy_rate(
    etcd_endpoints, tmp_path
):
    out, rdzv_id = str(tmp_path), run_id()
    agents = _agents(etcd_endpoints, rdzv_id, out, 3, "--replace-stragglers")
    try:
        first = _running(out, 3)
        time.sleep(1.0)
        spare = _agents(etcd_endpoints, rdzv_id, out, 1, "--replace-stragglers")[0]  # waits: the job is at 3 of 3
        agents.append(spare)
        time.sleep(8.0)
        healthy_until = time.time()
        slow = next(w for w in first if w["rank"] == 2)
        slowdown = Slowdown(slow["pid"], stopped=0.08)  # 80 %: this test is about the swap, the other about 60 %
        try:
            replaced = _running(out, 3, lambda w: w["pid"] not in {f["pid"] for f in first})
        finally:
            slowdown.stop()
        time.sleep(10.0)
        open(os.path.join(out, "stop"), "w").close()
        results = [finish(agent, 60) for agent in agents]
    finally:
        open(os.path.join(out, "stop"), "w").close()
        for agent in agents:
            agent.kill() if agent.poll() is None else None
    outputs = [text for _, text in results]
    for i, (code, text) in enumerate(results):  # shown in full when an assertion fails
        print(f"--- agent {i}: exit {code}\n" + "\n".join(x for x in text.splitlines() if not x.startswith("[rank")))
    assert [code for code, _ in results] == [0, 0, 0, 0], outputs
    everyone = {w["pid"]: w for w in workers(out)}
    rank0 = everyone[next(w["pid"] for w in first if w["rank"] == 0)]
    healthy = rate(rank0["steps"], rank0["steps"][0] + 3.0, healthy_until)
    after = next(everyone[r["pid"]] for r in replaced if r["rank"] == 0)
    swapped = rate(after["steps"], after["steps"][0] + 3.0, after["steps"][-1])
    dragged = rate(rank0["steps"], healthy_until + 3.0, rank0["steps"][-1])  # the slowed rank in the job
    print(
        f"\nsteps a second: healthy {healthy:.1f}, with the straggler {dragged:.1f}, "
        f"after the swap {swapped:.1f} ({swapped / healthy:.0%} of healthy)"
    )
    # The healthy and the swapped rates are measured 20 s apart while the tests beside this one load
    # the machine differently: clean-clone CI runs gave 12.5 healthy and 8.7 after the swap (f43571b),
    # 7.9 healthy, 6.1 with the straggler, 8.9 after (d7ba28b: the load, not the straggler, set the
    # pace then), and 6.3, 2.1, 3.8 at -n 4 (the swap done right, 60 % of a healthy rate measured under
    # less load); alone here 14.0, 6.2, 16.5. So the swapped job is held to the dragged one's rate,
    # measured just before: clearly faster, whatever the load.
    assert swapped > 1.2 * dragged, (healthy, dragged, swapped)
    assert {w["restart"] for w in replaced} == {0}, replaced  # a membership change: no restart used
    stepped_out = [text for text in outputs if "a spare waits: this node steps out for it (no restart used)" in text]
    assert len(stepped_out) == 1 and "rank 2 (local rank 0) is a straggler" in stepped_out[0], outputs
    after_out = stepped_out[0].split("no restart used)", 1)[1]
    assert "waiting for a place" in after_out and "group rank" not in after_out, stepped_out[0]  # a spare now
    assert ": group rank " in outputs[3], outputs[3]  # the spare took its place
    kinds = [e["kind"] for e in history(etcd_endpoints, rdzv_id)]
    assert "straggler" in kinds and "group_restarted" not in kinds, kinds


def test_watch_ddp_times_each_forward_to_its_gradients_and_no_evaluation(tmp_path):
    """The hooks alone, in one process (any module trained with backward; DDP adds its all-reduce):
    three training steps whose forward computes for 30 ms of CPU make three spans of about 30 ms; a
    forward under no_grad (an evaluation) makes none; outside elastic-run nothing is registered. The
    forward spins rather than sleeps: a span is its wall time less its wait for a CPU, at least its
    CPU time on any machine, while a sleep's share of the kernel's wait figure is not (CI once read
    65 ms for three 30 ms sleeps on a loaded VM)."""
    import subprocess
    import sys
    import textwrap

    from launcher.hangs import beatfile as beats

    record = str(tmp_path / "w.beat")
    beats.create(record)
    script = textwrap.dedent(
        """
        import time, torch, elastic

        class Slow(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(8, 8)

            def forward(self, x):
                until = time.thread_time() + 0.03
                while time.thread_time() < until:
                    pass
                return self.layer(x)

        model = elastic.watch_ddp(Slow())
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
        with torch.no_grad():
            model(torch.randn(4, 8))
        print(len(model._forward_pre_hooks))
        """
    )
    env = {**os.environ, "ELASTIC_HEARTBEAT_FILE": record}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reader = beats.BeatReader(record)
    work, spans = reader.work()
    reader.close()
    assert spans == 3 and 0.09 <= work < 0.5, (work, spans)
    outside = {k: v for k, v in os.environ.items() if k != "ELASTIC_HEARTBEAT_FILE"}
    done = subprocess.run([sys.executable, "-c", script], env=outside, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
