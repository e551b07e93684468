"""The agent's Prometheus metrics, through prometheus-client (imported only when the endpoint is on).

``Telemetry`` is what the agent tells: its no-op base costs nothing when ``--http-port`` is not
given; ``PrometheusTelemetry`` keeps the metrics in a registry of its own. Every metric carries the
``run_id`` (the job id; not ``job``, which Prometheus gives each scrape target) and ``node``
labels, never a credential.

    elastic_agent_state{state}                    1 for the agent's current state (init, rendezvous, ...; stopped:
                                                  told to stop by a signal, its workers being stopped)
    elastic_round                                 the round the agent last joined
    elastic_world_size, elastic_group_world_size  workers and nodes in that round
    elastic_group_rank                            this node's rank among the nodes
    elastic_job_restarts, elastic_job_max_restarts  the job's restart count and budget
    elastic_rendezvous_duration_seconds           from joining to the round's freeze (histogram)
    elastic_restarts_total{cause}                 rounds this node left: worker_failure, hang, membership_change, fence
    elastic_workers_running                       this node's workers now running
    elastic_lease_renewal_age_seconds             since the last acknowledged lease renewal was sent
    elastic_etcd_request_duration_seconds{method} each etcd call's try (histogram)
    elastic_etcd_request_errors_total{method,kind}  failed tries, by gRPC status (UNAVAILABLE, ...)
    elastic_hangs_total{culprit}                  hangs the job agreed on, by culprit rank ("deadlock": no one
                                                  rank; every node counts every hang of its rounds)
    elastic_fences_total                          times the workers were stopped for want of a lease renewal
    elastic_history_write_failures_total          history records that could not be written
    elastic_goodput_ratio                         the job's training time over its wall time so far, from its
                                                  history (group rank 0's agent, at each of its rounds' start)
    elastic_lost_seconds_total{cause}             the job's seconds lost so far, by cause (launcher.goodput):
                                                  waiting_for_nodes, rendezvous, start, redone, hang, straggler,
                                                  fenced, checks, stopping, unknown -- as group rank 0 last counted
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rendezvous.rounds.join import RendezvousInfo

__all__ = ["Telemetry", "PrometheusTelemetry", "STATES", "RestartCause", "CAUSES"]

STATES = ("init", "rendezvous", "running", "restarting", "succeeded", "failed", "stopped")


class RestartCause(str, enum.Enum):
    """Why a round of this node's workers ended and another one comes: ``elastic_restarts_total``'s
    ``cause`` label (the first two are ``FailureKind``'s values: the job's own failure record)."""

    WORKER_FAILURE = "worker_failure"
    HANG = "hang"
    MEMBERSHIP_CHANGE = "membership_change"
    FENCE = "fence"


CAUSES = tuple(cause.value for cause in RestartCause)


class Telemetry:
    """What the agent reports; this base does nothing (no endpoint)."""

    registry = None

    def state(self, state: str) -> None: ...

    def round_formed(self, info: RendezvousInfo, seconds: float) -> None: ...

    def restarted(self, cause: RestartCause) -> None: ...

    def healthy(self, ok: bool) -> None: ...

    def hung(self, culprit: str) -> None: ...

    def straggler_score(self, local_rank: int, value: float | None) -> None: ...

    def workers(self, running: int) -> None: ...

    def etcd_call(self, method: str, seconds: float, error: str | None) -> None: ...

    def history_failed(self) -> None: ...

    def lease_age(self, age: Callable[[], float]) -> None: ...

    def account(self, goodput: float, lost: dict[str, float]) -> None: ...


class PrometheusTelemetry(Telemetry):
    def __init__(self, job: str, node: str, *, max_restarts: int = 0) -> None:
        """``max_restarts``: this agent's --max-restarts, the budget shown until a round says the job's."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, disable_created_metrics

        disable_created_metrics()  # no *_created series: the counters start with the agent, as its uptime says
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # the agent's own RSS, CPU, open files
        labels, values = ("run_id", "node"), {"run_id": job, "node": node}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(**values)

        states = Gauge(
            "elastic_agent_state", "1 for the agent's current state", (*labels, "state"), registry=self.registry
        )
        self._states = {state: states.labels(state=state, **values) for state in STATES}
        self._round = gauge("elastic_round", "The round this agent last joined")
        self._world = gauge("elastic_world_size", "Workers in the round")
        self._nodes = gauge("elastic_group_world_size", "Nodes in the round")
        self._group_rank = gauge("elastic_group_rank", "This node's rank among the round's nodes")
        self._restarts = gauge("elastic_job_restarts", "The job's restart count (TORCHELASTIC_RESTART_COUNT)")
        self._budget = gauge("elastic_job_max_restarts", "The job's --max-restarts")
        self._running = gauge("elastic_workers_running", "This node's workers running now")
        self._healthy = gauge("elastic_node_healthy", "1 while this node passes its health checks (--health-check)")
        self._scores = Gauge(
            "elastic_straggler_score",
            "The job's fastest rank's own work a step over this local rank's (1: as fast; below 0.75: a straggler)",
            (*labels, "local_rank"),
            registry=self.registry,
        )
        self._lease_age = gauge(
            "elastic_lease_renewal_age_seconds", "Seconds since the last acknowledged lease renewal was sent"
        )
        self._goodput = gauge("elastic_goodput_ratio", "The job's training time over its wall time so far")
        self._lost = Counter(
            "elastic_lost_seconds",
            "The job's seconds lost so far, by cause",
            (*labels, "cause"),
            registry=self.registry,
        )
        self._lost_seen: dict[str, float] = {}
        self._counters(labels, values)
        self._values = values
        self.state("init")
        self._budget.set(max_restarts)
        self._healthy.set(1)

    def _counters(self, labels: tuple[str, ...], values: dict[str, str]) -> None:
        """The histograms and counters: rendezvous time, restarts by cause, etcd calls, fences, history."""
        from prometheus_client import Counter, Histogram

        self._rendezvous = Histogram(
            "elastic_rendezvous_duration_seconds",
            "From joining a round to its freeze",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
            registry=self.registry,
        ).labels(**values)
        causes = Counter(
            "elastic_restarts", "Rounds this node's workers left, by cause", (*labels, "cause"), registry=self.registry
        )
        self._causes = {cause: causes.labels(cause=cause, **values) for cause in CAUSES}
        self._etcd = Histogram(
            "elastic_etcd_request_duration_seconds",
            "etcd calls (each try)",
            (*labels, "method"),
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self._etcd_errors = Counter(
            "elastic_etcd_request_errors",
            "etcd calls that failed, by gRPC status",
            (*labels, "method", "kind"),
            registry=self.registry,
        )
        self._fences = Counter(
            "elastic_fences",
            "Times the workers were stopped for want of a lease renewal",
            labels,
            registry=self.registry,
        ).labels(**values)
        self._hangs = Counter(
            "elastic_hangs",
            "Hangs the job agreed on, by culprit rank ('deadlock' when every stopped rank waits in a collective)",
            (*labels, "culprit"),
            registry=self.registry,
        )
        self._history = Counter(
            "elastic_history_write_failures",
            "History records that could not be written",
            labels,
            registry=self.registry,
        ).labels(**values)

    def state(self, state: str) -> None:
        for name, gauge in self._states.items():
            gauge.set(1 if name == state else 0)

    def round_formed(self, info: RendezvousInfo, seconds: float) -> None:
        """A round formed after ``seconds`` of rendezvous: its numbers as this node sees them."""
        self._round.set(info.round)
        self._world.set(info.world_size)
        self._group_rank.set(info.group_rank)
        self._nodes.set(info.group_world_size)
        self._restarts.set(info.restart_count)
        self._budget.set(info.max_restarts)
        self._rendezvous.observe(seconds)

    def healthy(self, ok: bool) -> None:
        self._healthy.set(1 if ok else 0)

    def straggler_score(self, local_rank: int, value: float | None) -> None:
        """A local rank's score now; None: it has none (its round ended)."""
        if value is not None:
            self._scores.labels(local_rank=str(local_rank), **self._values).set(value)
            return
        try:
            self._scores.remove(self._values["run_id"], self._values["node"], str(local_rank))
        except KeyError:
            pass  # it had no score

    def restarted(self, cause: RestartCause) -> None:
        self._causes[cause.value].inc()
        if cause is RestartCause.FENCE:
            self._fences.inc()

    def hung(self, culprit: str) -> None:
        self._hangs.labels(culprit=culprit, **self._values).inc()

    def workers(self, running: int) -> None:
        self._running.set(running)

    def etcd_call(self, method: str, seconds: float, error: str | None) -> None:
        self._etcd.labels(method=method, **self._values).observe(seconds)
        if error is not None:
            self._etcd_errors.labels(method=method, kind=error, **self._values).inc()

    def history_failed(self) -> None:
        self._history.inc()

    def lease_age(self, age: Callable[[], float]) -> None:
        self._lease_age.set_function(age)

    def account(self, goodput: float, lost: dict[str, float]) -> None:
        """The job's account as counted now: the counters rise by what was lost since the last count."""
        self._goodput.set(goodput)
        for cause, seconds in lost.items():
            rise = seconds - self._lost_seen.get(cause, 0.0)
            if rise > 0:
                self._lost.labels(cause=cause, **self._values).inc(rise)
                self._lost_seen[cause] = seconds
