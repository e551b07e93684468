"""A hot spare's warm interpreter imports at the lowest CPU priority: on a machine it shares, a spare's
imports never slow the nodes that train. Only the importing thread is lowered; the workers, forked
from the interpreter's main thread, start at its priority. Real processes, a real etcd."""

from __future__ import annotations

import os
import sys

import psutil

from launcher.warmstart.interpreter import WarmStarter
from launcher.warmstart.priority import SPARE_NICE, may_raise

from .cli_helpers import agent_args, finish, run, run_id, start, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
HELD = os.path.join(WORKERS, "held.py")


def nices(pid: int) -> dict[int, int]:
    """Each thread of ``pid``: its nice value (field 19 of /proc/PID/task/TID/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                out[int(tid)] = int(stat.read().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError, ValueError):
            pass  # the thread ended
    return out


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the process's scheduling group (autogroup), None where the kernel has none."""
    try:
        with open(f"/proc/{pid}/autogroup") as group:
            return int(group.read().split()[-1])
    except OSError:
        return None


def lowered(pid: int) -> set[int]:
    """The nice values of the interpreter's threads but its main one (the one that forks)."""
    return {nice for tid, nice in nices(pid).items() if tid != pid}


def importing(pid: int) -> bool:
    """Whether the interpreter runs its preload on a thread of its own now."""
    return any(tid != pid for tid in nices(pid))


def slow_env(tmp_path) -> tuple[dict[str, str], str]:
    until = str(tmp_path / "imported")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([WORKERS, os.environ.get("PYTHONPATH", "")])}
    return {**env, "SLOW_IMPORT_UNTIL": until}, until


def test_a_spare_s_imports_run_at_the_lowest_priority_and_its_workers_at_the_interpreter_s(tmp_path):
    env, until = slow_env(tmp_path)
    warm = WarmStarter(["slow_import"], env, say=lambda line: None)
    try:
        wait_for(lambda: importing(warm.pid), 30, what="the preload thread")
        assert set(nices(warm.pid).values()) == {0}
        warm.background()  # a message: the interpreter's main thread lowers its importing thread
        wait_for(lambda: lowered(warm.pid) == {SPARE_NICE}, 10, what="the imports at the lowest priority")
        assert nices(warm.pid)[warm.pid] == 0, "the main thread, which forks the workers, was lowered"
        wait_for(lambda: autogroup_nice(warm.pid) in (None, SPARE_NICE), 10, what="its session's group lowered")
        open(until, "w").close()
        assert warm.can_start()
        out = tmp_path / "nice.txt"
        code = f"import os; open({str(out)!r}, 'w').write(str(os.nice(0)))"
        worker = warm.spawn([sys.executable, "-u", "-c", f"{code}; import time; time.sleep(30)"], env, 1, 2)
        try:
            wait_for(lambda: out.exists() and out.read_text(), 30, what="the worker's priority")
            assert out.read_text() == "0", "a worker forked from a spare's interpreter runs at a low priority"
            assert autogroup_nice(worker.pid) in (None, 0), "the worker's session weighs as little as a spare's"
        finally:
            os.kill(worker.pid, 9)
            worker.wait(timeout=10)
    finally:
        warm.close()


def test_called_into_a_round_a_spare_s_imports_go_back_to_the_interpreter_s_priority(tmp_path):
    env, until = slow_env(tmp_path)
    warm = WarmStarter(["slow_import"], env, say=lambda line: None)
    try:
        wait_for(lambda: importing(warm.pid), 30, what="the preload thread")
        warm.background()
        wait_for(lambda: lowered(warm.pid) == {SPARE_NICE}, 10, what="the imports at the lowest priority")
        warm.foreground()
        # raising a priority again takes CAP_SYS_NICE (or an RLIMIT_NICE); without it the imports end at the low one
        restored = {0} if may_raise() else {SPARE_NICE}
        wait_for(lambda: lowered(warm.pid) == restored, 10, what=f"the imports at nice {restored}")
        wait_for(lambda: autogroup_nice(warm.pid) in (None, *restored), 10, what="its session's group restored")
        open(until, "w").close()
        assert warm.can_start()
    finally:
        warm.close()


def test_a_spare_whose_imports_ended_lowered_forks_its_workers_from_a_group_at_its_own_priority(tmp_path):
    """The low priority is the imports': a spare that finished them waiting puts its session's group
    back (the interpreter, at its imports' end), and so does its agent when workers are asked for (a
    group lowered as the imports ended). In a lowered group each fork waited a second or more for a
    CPU on a loaded machine."""
    env, until = slow_env(tmp_path)
    warm = WarmStarter(["slow_import"], env, say=lambda line: None)
    try:
        wait_for(lambda: importing(warm.pid), 30, what="the preload thread")
        warm.background()
        wait_for(lambda: autogroup_nice(warm.pid) in (None, SPARE_NICE), 10, what="its session's group lowered")
        open(until, "w").close()
        wait_for(lambda: autogroup_nice(warm.pid) in (None, 0), 30, what="its group back at its imports' end")
        if autogroup_nice(warm.pid) is not None:  # lowered again as the imports ended: the agent's turn
            with open(f"/proc/{warm.pid}/autogroup", "w") as group:
                group.write(str(SPARE_NICE))
        assert warm.can_start()
        assert autogroup_nice(warm.pid) in (None, 0), "workers are forked from a lowered group"
    finally:
        warm.close()


def test_an_agent_waiting_as_a_spare_lowers_its_interpreter_s_imports(etcd_endpoints, tmp_path):
    env, until = slow_env(tmp_path)
    job = run_id()
    args = [*agent_args(etcd_endpoints, job, "1", nproc=1), "--preload", "slow_import"]
    first = start([*args, HELD, str(tmp_path / "held")], env={**env, "SLOW_IMPORT_UNTIL": ""})  # imports at once
    try:
        wait_for(lambda: os.path.exists(tmp_path / "held"), 60, what="the first node's worker")
        spare = start([*args, HELD, str(tmp_path / "spare-held")], env=env)  # imports until the test says
        try:
            interpreter = wait_for(lambda: _interpreter_of(spare.pid), 30, what="the spare's warm interpreter")
            wait_for(lambda: importing(interpreter), 30, what="the spare's preload thread")
            wait_for(
                lambda: lowered(interpreter) == {SPARE_NICE}, 30, what="the spare's imports at the lowest priority"
            )
            assert nices(interpreter)[interpreter] == 0
            wait_for(lambda: autogroup_nice(interpreter) in (None, SPARE_NICE), 10, what="the spare's group lowered")
        finally:
            open(until, "w").close()
            close = ["close", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", job, "--reason", "the test ended"]
            assert run(close, tool_name="elastic-ctl").returncode == 0
            assert finish(spare)[0] == 4
    finally:
        open(until, "w").close()
        assert finish(first)[0] == 4


def _interpreter_of(agent: int) -> int | None:
    """The pid of the agent's warm interpreter (its child running zygote.py), or None yet."""
    try:
        for child in psutil.Process(agent).children():
            if any("zygote.py" in part for part in child.cmdline()):
                return child.pid
    except psutil.Error:  # the agent or the child ended meanwhile: asked again
        pass
    return None
