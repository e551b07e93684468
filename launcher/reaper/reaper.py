"""The reaper: a tiny process that outlives its agent, and fences it when the agent cannot.

The agent starts it with a pipe on its stdin and a pipe from its stdout, and writes lines to it
(``wire.py``, loaded here by its path: the worker groups started and stopped, the fence
deadline -- CLOCK_MONOTONIC, which every process shares: the agent's lease may be given up by etcd
soon after it, so its workers must be gone by then --, the agent's lease, its round, how to reach
etcd, and its temporary directories (its log root, heartbeat files, a local etcd's data).

- Dead man's switch: when the deadline passes without a newer one, every registered group gets
  SIGKILL and the reaper answers ``F<deadline>`` on stdout. The agent moves the deadline on after
  each acknowledged lease renewal, so this happens only when the agent cannot renew -- etcd is
  out of reach, or the agent itself is frozen or hung, which is why it is done here and not there.
- Every wait is against the deadline itself (CLOCK_MONOTONIC), checked again after any wake-up,
  before anything read meanwhile: a reaper stopped with its machine (SIGSTOP, a paused VM) would
  otherwise resume ``select()`` with the relative time that was left when it stopped. SIGCONT wakes
  it at once, and a wait is never longer than ``_SLICE`` in any case.
- When stdin reaches EOF -- the agent exited, however it exited -- every group still registered
  gets SIGKILL (grandchildren in the same group included), and then the lease is revoked so the
  other nodes hear at once that this one is gone. Only then is the etcd client imported. Last,
  the agent's temporary directories are removed: an agent killed outright leaves none behind.

Run by path with ``python -I -S``: standard library only until the lease is revoked; then the agent's
import path (``sys_path`` in the config) is added and the project's etcd client imported.
"""

from __future__ import annotations

import importlib.util
import os
import select
import shutil
import signal
import sys
import time

_REVOKE_BUDGET = 3.0  # seconds the revoke of a dead agent's lease may take
_SLICE = 0.5  # seconds: the longest one wait lasts before the deadline is looked at again
_TEMPORARY = "elastic-"  # the name of every temporary directory the project makes starts so: nothing else is removed


def _load_wire():
    """``wire.py`` beside this file, loaded by its path (run by path with -I, this process has
    no package to import it from)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py")
    spec = importlib.util.spec_from_file_location("reaper_wire", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


if __package__:  # imported (the agent's fence uses kill_groups): the package's module
    from . import wire
else:  # run by path
    wire = _load_wire()


def kill_groups(pgids) -> int:
    """SIGKILL to each process group (grandchildren included); how many there were to kill."""
    killed = 0
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


class Reaper:
    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.deadline: float | None = None
        self.lease = 0
        self.round = 0
        self.config = None  # a wire.Config
        self.temporary: list[str] = []

    def handle(self, line: str) -> None:
        message = wire.decode(line)
        if isinstance(message, (wire.Started, wire.Stopped)):
            (self.groups.add if isinstance(message, wire.Started) else self.groups.discard)(message.pgid)
        elif isinstance(message, wire.Deadline):
            self.deadline = message.at
        elif isinstance(message, wire.Lease):
            self.lease = message.lease_id
        elif isinstance(message, wire.Round):
            self.round = message.number
        elif isinstance(message, wire.Temporary):
            self._temporary(message.path)
        elif isinstance(message, wire.Config) or line.startswith("C"):
            self.config = message  # a config that does not decode: none (the lease then expires by its TTL)

    def _temporary(self, path: str) -> None:
        if not path:
            self.temporary.clear()
        elif os.path.isabs(path) and os.path.basename(path).startswith(_TEMPORARY):
            self.temporary.append(path)

    def remove_temporary(self) -> None:
        for path in self.temporary:
            shutil.rmtree(path, ignore_errors=True)

    def kill_all(self) -> int:
        return kill_groups(self.groups)

    def overdue(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def wait_time(self) -> float | None:
        """How long the next wait for input may last (None: no deadline, until input comes)."""
        if self.deadline is None:
            return None
        return min(max(self.deadline - time.monotonic(), 0.0), _SLICE)

    def fence(self, out) -> None:
        """The deadline passed: kill every group and tell the agent."""
        deadline, self.deadline = self.deadline, None
        if self.kill_all():
            try:
                out.write(wire.encode(wire.Fenced(deadline)))
                out.flush()
            except OSError:
                pass
        self.groups.clear()

    def revoke(self) -> None:
        if not self.lease or not self.config:
            return
        died_at = time.time()  # the record's time: before the revoke, which lets the next round form
        for path in reversed(self.config.sys_path):
            if path not in sys.path:
                sys.path.insert(0, path)
        try:
            from rendezvous.etcd.client import EtcdClient, EtcdTarget

            client = EtcdClient(EtcdTarget.from_json(self.config.target).with_timeout(_REVOKE_BUDGET))
            try:
                if client.revoke_lease(self.lease):  # else a peer's verdict ended it first, and said so
                    self.record_death(client, died_at)
            finally:
                client.close()
        except Exception:  # noqa: BLE001 -- nothing to report to: the lease then expires by its TTL
            pass

    def record_death(self, client, died_at: float) -> None:
        """A node_left record in the job's history, as the agent's own HistoryWriter would write it,
        timed when the reaper found its agent dead: before the round its departure lets form (the
        history is in time order, and the record is written only once the revoke said it was first)."""
        where = self.config.history if self.config is not None else None
        if not where:
            return
        from rendezvous.job.history import Event, job_lease

        event = Event(
            died_at,
            self.round,
            where["node"],
            "node_left",
            {"reason": "the agent died; its reaper killed the workers and revoked the lease"},
        )
        lease = job_lease(client, where["prefix"])
        if lease is not None:  # None: the job is gone; the record would outlive it
            client.put(event.key(where["prefix"]), event.encode(), lease=lease)


def _woken(signum, frame) -> None:
    """SIGCONT: the machine (or this process) was stopped and goes on; ``select`` returns at once and
    the deadline is looked at before anything else."""


def main() -> None:
    for name in ("SIGINT", "SIGHUP", "SIGTERM", "SIGPIPE"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGCONT, _woken)
    reaper = Reaper()
    out = sys.stdout.buffer
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        if reaper.overdue():  # first, whatever woke us: a line sent before a freeze cannot move it
            reaper.fence(out)
        ready, _, _ = select.select([stdin], [], [], reaper.wait_time())
        if reaper.overdue():
            reaper.fence(out)
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            reaper.handle(line.decode(errors="replace"))
    reaper.kill_all()
    reaper.revoke()
    reaper.remove_temporary()


if __name__ == "__main__":
    main()
