"""``srun elastic-run`` on a real SLURM (munged, slurmctld and 3 slurmd on loopback): the job forms
from the allocation with etcd inside it, signals do what a batch job needs, and a lost agent, a lost
etcd member or a requeue cost what they should. Each test prints what ``scontrol show job`` said."""

from __future__ import annotations

import glob
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.cli_helpers import wait_for

from .cluster import SlurmCluster, missing

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).resolve().parent / "workers" / "worker.py")
BIN = os.path.dirname(sys.executable)

why_not = missing()
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"no SLURM here: {why_not}")


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster(3, cpus=2, kill_wait=5).start()
    cluster.env["PATH"] = f"{BIN}:{cluster.env['PATH']}"  # elastic-run, as an activated venv has it
    try:
        yield cluster
    finally:
        cluster.close()


def _submit(slurm: SlurmCluster, tmp_path: Path, *args: str, env: dict | None = None) -> str:
    shown = slurm.run(["sbatch", "--parsable", "-o", str(tmp_path / "job-%j.out"), *args], env=env or {}, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip().split(";")[0]


def _wrap(out: Path, seconds: float, extra: str = "") -> list[str]:
    return [
        "-N",
        "3",
        "--ntasks-per-node",
        "1",
        "--wrap",
        f"srun elastic-run --nproc-per-node 2 {extra} {WORKER} {out} {seconds}",
    ]


def _until(check, timeout: float, what: str, story=None):
    return wait_for(check, timeout, interval=0.1, what=what, story=story)


def _six_workers(slurm: SlurmCluster, tmp_path: Path, job: str, out: Path) -> dict[int, tuple[int, int]]:
    def story() -> str:
        return "\n".join([_show(slurm, job), _output(tmp_path, job), _agent_logs(out), slurm.run(["sinfo"]).stdout])

    return _until(lambda: (w := _workers(out)) and len(w) == 6 and w, 60, "6 workers", story)


def _done(slurm: SlurmCluster, job: str, timeout: float) -> str:
    """The job's final state (COMPLETED, FAILED, CANCELLED, ...)."""
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    return _until(lambda: (s := slurm.job_state(job)) in final and s, timeout, f"end of job {job}")


def _show(slurm: SlurmCluster, job: str) -> str:
    shown = slurm.run(["scontrol", "show", "job", job]).stdout
    keep = ("JobState", "ExitCode", "RunTime", "Restarts", "NodeList")
    return " ".join(part for part in shown.split() if part.split("=")[0] in keep)


def _output(tmp_path: Path, job: str) -> str:
    path = tmp_path / f"job-{job}.out"
    return path.read_text() if path.exists() else ""  # written once the job starts


def _workers(out: Path, restart: int = 0) -> dict[int, tuple[int, int]]:
    """rank -> (pid, world size) of the workers that started in that restart."""
    found = {}
    for path in glob.glob(str(out / f"[0-9]*.{restart}.*")):
        rank, _, pid = os.path.basename(path).split(".")
        found[int(rank)] = (int(pid), int(Path(path).read_text() or 0))
    return found


def test_the_sbatch_example_runs_on_three_nodes_with_the_whole_world(slurm, tmp_path):
    job = _submit(
        slurm, tmp_path, "examples/slurm/train.sbatch", "--checkpoint", str(tmp_path / "ck.pt"), env={"EPOCHS": "3"}
    )
    state = _done(slurm, job, 120)
    output = _output(tmp_path, job)
    print(f"\n{_show(slurm, job)}")
    assert state == "COMPLETED" and "ExitCode=0:0" in _show(slurm, job), output
    assert len(re.findall(r"round 1: group rank \d of 3 nodes, global ranks \d\.\.\d of 6", output)) == 3, output
    assert len(re.findall(r"etcd member m\d of the allocation", output)) == 3 and "epoch 3/3" in output, output


def test_usr1_reaches_every_worker_and_the_job_goes_on(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = _submit(slurm, tmp_path, *_wrap(out, 60))
    _six_workers(slurm, tmp_path, job, out)
    started = time.monotonic()
    assert slurm.run(["scancel", "-s", "USR1", job]).returncode == 0
    _until(lambda: len(glob.glob(str(out / "*.usr1"))) == 6, 10, "SIGUSR1 at all 6 workers")
    print(f"\nscancel -s USR1: all 6 workers had it {time.monotonic() - started:.2f} s later")
    (out / "stop").touch()
    assert _done(slurm, job, 60) == "COMPLETED", _output(tmp_path, job)
    output = _output(tmp_path, job)
    assert output.count("SIGUSR1: passed to 2 workers") == 3 and not _workers(out, 1), output
    print(_show(slurm, job))


def test_scancel_stops_every_worker_within_the_grace_period_and_leaves_no_process(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # each agent's own lines to a file: srun, cancelled too, stops forwarding its tasks' output
    agent = f"elastic-run --nproc-per-node 2 --shutdown-timeout 3 {WORKER} {out} 300 2>{out}/agent-$SLURMD_NODENAME.log"
    job = _submit(slurm, tmp_path, "-N", "3", "--ntasks-per-node", "1", "--wrap", f"srun bash -c '{agent}'")
    workers = _six_workers(slurm, tmp_path, job, out)
    started = time.monotonic()
    assert slurm.run(["scancel", job]).returncode == 0
    _until(lambda: not any(psutil.pid_exists(pid) for pid, _ in workers.values()), 3 + 5, "every worker gone")
    gone = time.monotonic() - started
    story = lambda: f"{_left(job)}\n{_agent_logs(out)}"  # noqa: E731
    left = _until(lambda: not _of_job(job) and "none", 15, f"no process of job {job} left", story=story)
    print(
        f"\nscancel: every worker gone {gone:.2f} s later, no process of the job left ({left}) "
        f"{time.monotonic() - started:.2f} s later; {_show(slurm, job)}"
    )
    assert _done(slurm, job, 30) == "CANCELLED"
    said = [Path(p).read_text() for p in glob.glob(str(out / "agent-*.log"))]
    assert [text.count("stopped by SIGTERM [exit 143: worth a retry]") for text in said] == [1, 1, 1], said


def test_a_killed_agent_makes_the_others_rerank_without_a_restart(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = _submit(slurm, tmp_path, *_wrap(out, 300))
    workers = _six_workers(slurm, tmp_path, job, out)
    agent = psutil.Process(workers[5][0]).parent()  # global rank 5: the third node's second worker
    assert "elastic-run" in " ".join(agent.cmdline())
    agent.send_signal(signal.SIGKILL)
    # the survivors form a round of 2 nodes, 4 workers, restart count still 0
    rerun = _until(lambda: sorted(_in_world(out, 4)) == [0, 1, 2, 3] and _in_world(out, 4), 60, "the survivors' round")
    output = _output(tmp_path, job)
    assert len(re.findall(r"round 2: group rank \d of 2 nodes, global ranks \d\.\.\d of 4", output)) == 2, output
    assert not _workers(out, 1), "a lost node used a restart"
    print(f"\nagent on the third node killed: ranks {sorted(rerun)} now in a world of 4, restart count 0")
    (out / "stop").touch()
    _done(slurm, job, 60)


def test_an_etcd_member_of_the_allocation_killed_the_job_goes_on(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = _submit(slurm, tmp_path, *_wrap(out, 8))
    _six_workers(slurm, tmp_path, job, out)
    member = next(p for p in _of_job(job) if "etcd" in p.name() and "m1" in p.cmdline())
    member.send_signal(signal.SIGKILL)
    assert _done(slurm, job, 60) == "COMPLETED", _output(tmp_path, job)
    assert not _workers(out, 1) and "round 2" not in _output(tmp_path, job), _output(tmp_path, job)
    print(f"\netcd member m1 killed: the job went on and completed; {_show(slurm, job)}")


def test_a_requeued_job_resumes_from_its_checkpoint_with_the_same_job_id(slurm, tmp_path):
    checkpoint = tmp_path / "ck.pt"
    job = _submit(
        slurm,
        tmp_path,
        "examples/slurm/train.sbatch",
        "--checkpoint",
        str(checkpoint),
        env={"EPOCHS": "12", "ELASTIC_NO_REQUEUE": "1"},
    )
    _until(lambda: "epoch 3/12" in _output(tmp_path, job), 60, "epoch 3")
    assert slurm.run(["scontrol", "requeue", job]).returncode == 0
    # SLURM holds a requeued job back for a while (its BeginTime, 2 minutes here): start it now
    _until(lambda: slurm.job_state(job) == "PENDING", 30, "the requeued job pending")
    assert slurm.run(["scontrol", "update", f"jobid={job}", "StartTime=now"]).returncode == 0
    _until(lambda: "Restarts=1" in _show(slurm, job) and slurm.job_state(job) == "RUNNING", 30, "the requeued run")
    state = _done(slurm, job, 60)
    output = _output(tmp_path, job)
    resumed = re.search(r"resumed from \S+ at epoch \d+", output)
    assert state == "COMPLETED" and resumed, output
    print(f"\n{_show(slurm, job)}; {resumed.group(0)}")
    assert output.count(f"--rdzv-id slurm-{job}") == 6, "both runs use the same job id"


def _in_world(out: Path, size: int) -> list[int]:
    """The ranks of the workers (of any restart) that started in a world of ``size``."""
    return [
        int(os.path.basename(p).split(".")[0])
        for p in glob.glob(str(out / "*.*.*"))
        if Path(p).read_text() == str(size)
    ]


def _agent_logs(out: Path) -> str:
    """What each agent wrote to its own file under ``out`` (a wait's story)."""
    paths = sorted(glob.glob(str(out / "agent-*")))
    return "\n".join(f"--- {p}:\n{Path(p).read_text(errors='replace')}" for p in paths)


def _left(job: str) -> str:
    """The job's processes still there: pid, parent, state and command line (a wait's story)."""
    lines = []
    for process in _of_job(job):
        try:
            lines.append(f"{process.pid} (parent {process.ppid()}, {process.status()}): {' '.join(process.cmdline())}")
        except psutil.Error:
            continue
    return "\n".join(lines) or "none by now"


def _of_job(job: str) -> list[psutil.Process]:
    """Live processes whose environment says they belong to SLURM job ``job``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get("SLURM_JOB_ID") == job:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
