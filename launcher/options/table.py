"""elastic-run's options, in one table: each option's spellings, type, default, help line, help
group, torchrun's spelling, whether it takes effect here, and the longer words of the docs.

From this table are made: the click options of ``elastic-run`` (``launcher.cli.clickopts``), ``--help``'s
groups and its list of options accepted with no effect (``launcher.cli.helpfmt``), the checks of
``LaunchConfig``'s fields that are options too (``check_field``), and the options table of
docs/getting-started.md (``launcher.cli.helpfmt.markdown``; ``tests/unit/test_readme.py`` keeps the two equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from launcher.workers.numa import MODES as NUMA_MODES

__all__ = [
    "Option",
    "OPTIONS",
    "GROUP_ORDER",
    "check_field",
    "env_name",
    "moot",
    "grouped",
]

GROUP_ORDER = (
    "The job",
    "Rendezvous (etcd)",
    "Workers",
    "Health, hangs and crash loops",
    "Stopping",
    "Output and logs",
    "Metrics and probes",
    "torchft",
)
SAME = "same"  # torchrun spells it as we do (the docs' table says so)


@dataclass(frozen=True)
class Whole:
    """A whole number from ``minimum`` (to ``maximum``)."""

    minimum: int
    maximum: int | None = None

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            return f"an integer >= {self.minimum}"
        if self.maximum is not None and value > self.maximum:
            return f"an integer from {self.minimum} to {self.maximum}"
        return None


@dataclass(frozen=True)
class Seconds:
    """A number of seconds: above 0 (``positive``) or from 0."""

    positive: bool = True

    def problem(self, value: Any) -> str | None:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not ok or value < 0 or (self.positive and value == 0):
            return "a positive number of seconds" if self.positive else "a number of seconds >= 0"
        return None


@dataclass(frozen=True)
class Choice:
    values: tuple[str, ...]

    def problem(self, value: Any) -> str | None:
        return None if value in self.values else f"one of {', '.join(self.values)}"


@dataclass(frozen=True)
class Option:
    """One option of elastic-run."""

    names: tuple[str, ...]  # its spellings, the one help shows first (--a-b; torchrun's --a_b is added)
    help: str  # --help's line
    group: str  # --help's group (GROUP_ORDER)
    doc: str = ""  # the docs' words (else the help line)
    default: Any = None
    check: Whole | Seconds | Choice | None = None  # the value's type (None: text, parsed later)
    flag: bool = False
    off: str = ""  # a boolean's negative spelling (--no-warm-start)
    dest: str = ""  # the parameter's name when it is not the first spelling's
    env: str | None = ""  # PET_<env> ("": from the name; None: torchrun reads none)
    metavar: str | None = None
    shown_default: str = ""  # the default as help and the docs say it ("": none shown)
    torchrun: str | None = SAME  # torchrun's spelling; None: this project's own
    effect: bool = True  # False: accepted as torchrun takes it, with no effect here
    field: str = ""  # LaunchConfig's field of the same meaning, checked by ``check`` there too

    @property
    def name(self) -> str:
        """The spelling that names it: its first long one (``--module`` for ``-m``)."""
        return next(n for n in self.names if n.startswith("--"))

    @property
    def key(self) -> str:
        """Its parameter's name: ``dest``, else the name's (``nproc_per_node``)."""
        return self.dest or self.name[2:].replace("-", "_")

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling the parser takes: ours, then torchrun's ``--a_b`` for each ``--a-b``."""
        under = tuple("--" + n[2:].replace("-", "_") for n in self.names if n.startswith("--") and "-" in n[2:])
        return self.names + under

    @property
    def shown(self) -> str:
        """The spellings as help and the docs list them: ``-m, --module``, ``--warm-start / --no-warm-start``."""
        short = [n for n in self.names if not n.startswith("--")]
        long = [n for n in self.names if n.startswith("--")]
        text = ", ".join([*short, *long])
        return f"{text} / {self.off}" if self.off else text


def _opt(*names: str, **fields: Any) -> Option:
    return Option(names, **fields)


_JOB, _RDZV, _WORKERS, _HANGS, _STOP, _OUT, _PROBES, _TORCHFT = GROUP_ORDER

# One option a few lines, as a table reads (the formatter would give each field a line of its own).
# fmt: off
OPTIONS: tuple[Option, ...] = (
    _opt("--nnodes", help="Number of nodes, N or MIN:MAX.", group=_JOB, default="1:1", metavar="N|MIN:MAX",
         shown_default="1:1",
         doc="nodes in the job"),
    _opt("--nproc-per-node", help="Workers per node: a number, cpu, gpu, xpu or auto.", group=_JOB, default="1",
         metavar="N|cpu|gpu|xpu|auto", shown_default="1",
         doc="workers on this node (`auto`: one per installed GPU that `CUDA_VISIBLE_DEVICES` shows, else one per "
         "Intel XPU, else one per CPU this process may run on, as torchrun counts them)"),
    _opt("--max-restarts", help="Worker group restarts after a failure (the job's budget).", group=_JOB, default=0,
         check=Whole(0), metavar="N", shown_default="0", field="max_restarts",
         doc="restarts of the worker group after a worker failure (the job's count: the first agent's)"),
    _opt("--standalone", help="One node: a local etcd, a random job id.", group=_JOB, flag=True,
         doc="one node: starts the bundled etcd on a free loopback port, random job id; "
         "`--rdzv-backend/-endpoint/-id` are ignored, said in one line (as torchrun). Without an endpoint, one "
         "node is run so anyway"),
    _opt("--rdzv-endpoint", help="etcd's endpoints, host:port[,host:port...].", group=_RDZV, default="",
         metavar="HOST:PORT,...",
         doc="etcd endpoints `host[:port][,...]`, default port 2379, `https://` for TLS (none and one node: as "
         "`--standalone`)"),
    _opt("--rdzv-id", help="Job id, the same on every node.", group=_RDZV, metavar="ID",
         doc="the job id, the same on every node (a path and key segment: no `/`, `\\`, `..`, spaces or control "
         "characters)"),
    _opt("--rdzv-conf", help="Rendezvous settings, key=value,... (keys: --help-rdzv-conf).", group=_RDZV, default="",
         metavar="K=V,...",
         doc="rendezvous settings, see the settings table (`--help-rdzv-conf`)"),
    _opt("--rdzv-backend", help="etcd-v3 (aliases: etcd, etcd-v2), or c10d: an etcd the endpoint's host serves.",
         group=_RDZV, default="etcd-v3", metavar="NAME", shown_default="etcd-v3",
         doc="`etcd-v3` (aliases `etcd`, and `etcd-v2`, which runs on the v3 API, said in one line); `c10d`: "
         "torchrun's line as it is, on an etcd the agent on the endpoint's host serves (port 29400 by default); "
         "`static` is refused naming the alternative"),
    _opt("--local-addr", help="This node's address as the others reach it.", group=_RDZV, metavar="ADDR",
         shown_default="FQDN",
         doc="this node's address as the others reach it (`MASTER_ADDR` when it is group rank 0)"),
    _opt("--master-port", help="Port of the c10d store group rank 0's agent hosts.", group=_RDZV,
         check=Whole(0, 65535), metavar="PORT", shown_default="a free one",
         doc="the port of the c10d store that group rank 0's agent hosts (`MASTER_PORT`); where another agent on "
         "the host holds it, a free one, said once"),
    _opt("--node-rank", help="Static rendezvous only.", group=_RDZV, default=0, check=Whole(0), metavar="N",
         effect=False,
         doc="static rendezvous only: ignored, said in one line"),
    _opt("--master-addr", help="Static rendezvous only.", group=_RDZV, metavar="ADDR", effect=False,
         doc="static rendezvous only: ignored, said in one line"),
    _opt("-m", "--module", help="Run SCRIPT as a module (python -m).", group=_WORKERS, flag=True, dest="module",
         doc="run `python -m SCRIPT`"),
    _opt("--no-python", help="Run SCRIPT as a program, not with python.", group=_WORKERS, flag=True,
         doc="run SCRIPT as a program"),
    _opt("--run-path", help="Run SCRIPT with runpy.run_path.", group=_WORKERS, flag=True,
         doc="run SCRIPT with `runpy.run_path`"),
    _opt("--role", help="ROLE_NAME of the workers.", group=_WORKERS, default="default", metavar="NAME",
         shown_default="default",
         doc="`ROLE_NAME` of the workers"),
    _opt("--start-method", help="torchrun's; workers start as --warm-start says.", group=_WORKERS, default="spawn",
         check=Choice(("spawn", "fork", "forkserver")), effect=False,
         doc="accepted for torchrun's sake: workers are forked from a warm interpreter, or started fresh with "
         "`--no-warm-start`, whatever it says"),
    _opt("--numa-binding", help="Bind each worker to the CPUs near its GPU.", group=_WORKERS,
         check=Choice(tuple(NUMA_MODES)), env=None, metavar="|".join(NUMA_MODES),
         doc="bind each worker (`taskset -c`) to the CPUs of its GPU's NUMA node (no GPU: the nodes round robin), "
         "its socket, its even share of the node's physical cores, or one last-level-cache group; on a machine "
         "with one NUMA node it is a no-op, said once"),
    _opt("--virtual-local-rank", help="LOCAL_RANK=0, each worker one CUDA device.", group=_WORKERS, flag=True,
         doc="every worker gets `LOCAL_RANK=0` and `CUDA_VISIBLE_DEVICES` naming its own device (its entry of the "
         "agent's list, else its local rank)"),
    _opt("--warm-start", help="Fork workers from a warm interpreter.", group=_WORKERS, default=True, flag=True,
         off="--no-warm-start", shown_default="on", torchrun=None,
         doc="fork each Python worker from an interpreter the agent started beforehand, which has imported torch "
         "(see Warm starts); `--no-warm-start`: fresh processes"),
    _opt("--preload", help="More modules for that interpreter, a,b,...", group=_WORKERS, default="",
         metavar="MODULES", torchrun=None,
         doc="more modules for that interpreter to import (comma-separated), as the workers will"),
    _opt("--checkpoint-dir", help="Where elastic.checkpoint saves are copied.", group=_WORKERS, metavar="DIR",
         shown_default="memory only", torchrun=None, field="checkpoint_dir",
         doc="where the agent copies the workers' `elastic.checkpoint` saves (see State kept in memory)"),
    _opt("--checkpoint-every", help="A copy there every N saves of a rank.", group=_WORKERS, default=10,
         check=Whole(1), metavar="N", shown_default="10", torchrun=None, field="checkpoint_every",
         doc="a copy to `--checkpoint-dir` every N saves of a rank, and one at its end"),
    _opt("--heartbeat-timeout", help="Seconds without a heartbeat: hung.", group=_HANGS, check=Seconds(),
         metavar="SECONDS", shown_default="learned", torchrun=None, field="heartbeat_timeout",
         doc="seconds without `elastic.heartbeat()` after which a worker is hung (learned: 5x the slowest step "
         "after 5 steps, at least 5 s, or 1 s for a worker whose processes do nothing at all; see Hangs)"),
    _opt("--first-heartbeat-timeout", help="Seconds from start to the first heartbeat.", group=_HANGS,
         check=Seconds(), metavar="SECONDS", shown_default="900", torchrun=None, field="first_heartbeat_timeout",
         doc="seconds from a worker's start to its first heartbeat; when given, a worker that never beats is "
         "judged by it"),
    _opt("--health-check", help="A command that must exit 0 before a rank.", group=_HANGS, default="",
         metavar="CMD", shown_default="none", torchrun=None, field="health_check",
         doc="run by the shell with the workers' environment before this node takes a rank (its first round, and "
         "after its own workers failed); besides it the log and checkpoint directories must be writable with free "
         "space, and on a GPU node each device must run a matmul; a node that fails takes no rank, says why and "
         "checks again on a back-off (see Health gate)"),
    _opt("--crash-loop-restarts", help="Restarts in a row with no progress: closed.", group=_HANGS, default=3,
         check=Whole(0), metavar="N", shown_default="3", torchrun=None, field="crash_loop_restarts",
         doc="restarts in a row in which no worker beat more heartbeats than ever before, no newer "
         "`elastic.checkpoint` step was saved and no round ran `--progress-window` seconds: the job is closed "
         "as a crash loop, exit code 5, do not requeue (0: never; see Crash loops)"),
    _opt("--replace-stragglers", help="Swap a straggler's node for a waiting spare.", group=_HANGS, flag=True,
         torchrun=None, field="replace_stragglers",
         doc="a node whose rank is named a straggler (see Stragglers) steps out when a hot spare waits: the spare "
         "takes its place, no restart is used, and the node waits as a spare itself"),
    _opt("--preflight", help="Check the nodes in pairs before a round with a new node.", group=_HANGS, flag=True,
         torchrun=None, field="preflight",
         doc="before the workers of a round with a node new to the job start, the round's nodes time a matmul and "
         "an all-reduce in pairs; a faulty or slow node leaves the job (exit 200) if the job keeps its minimum "
         "without it (see Pre-flight check)"),
    _opt("--progress-window", help="Seconds a round runs that count as progress.", group=_HANGS, default=300.0,
         check=Seconds(), metavar="SECONDS", shown_default="300", torchrun=None, field="progress_window",
         doc="a round that ran this long before it failed made progress, whatever its heartbeats said"),
    _opt("--signals-to-handle", help="Signals that stop the job gracefully.", group=_STOP,
         default="SIGTERM,SIGINT,SIGHUP,SIGQUIT", metavar="SIGNALS", shown_default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
         doc="signals that stop the job gracefully; the workers get the same signal, then SIGKILL after the "
         "shutdown timeout; exported to the workers as `TORCHELASTIC_SIGNALS_TO_HANDLE`"),
    _opt("--shutdown-timeout", "--stop-grace", help="Seconds from the stop signal to SIGKILL.", group=_STOP,
         check=Seconds(positive=False), dest="stop_grace", metavar="SECONDS",
         shown_default="$TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30",
         doc="seconds between the stop signal and SIGKILL when stopping workers (`--stop-grace`: this project's "
         "older name)"),
    _opt("--exit-barrier-timeout", help="Seconds a finished node waits for the others.", group=_STOP,
         default=300.0, check=Seconds(), metavar="SECONDS", shown_default="300", torchrun=None,
         field="exit_barrier_timeout",
         doc="seconds a node whose workers all exited 0 waits for the other nodes' (torch's agent's "
         "`exit_barrier_timeout`); past it the node says which nodes still run and exits 0"),
    _opt("--exit-stuck-timeout", help="Seconds a worker does nothing after the others exited.", group=_STOP,
         default=60.0, check=Seconds(positive=False), metavar="SECONDS", shown_default="60", torchrun=None,
         field="exit_stuck_timeout",
         doc="a worker still alive this long after every other rank of its round exited 0, with no CPU and no "
         "I/O in that time, is stuck at exit (a teardown deadlock): named with its native stack and ended, "
         "and the round succeeds (0: never; see Every run ends)"),
    _opt("--monitor-interval", help="Seconds between checks of the workers.", group=_STOP, default=0.1,
         check=Seconds(), metavar="SECONDS", shown_default="0.1", field="monitor_interval",
         doc="seconds between checks of the workers"),
    _opt("--log-dir", help="Directory of the logs and error files.", group=_OUT, metavar="DIR",
         shown_default="a temporary one",
         doc="`<log-dir>/<job id>/<node>/attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}`"),
    _opt("-r", "--redirects", help="Output to log files only: 0-3 or RANK:0-3,...", group=_OUT, default="0",
         metavar="0-3|RANK:0-3,...", shown_default="0",
         doc="output to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank `0:1,1:3`"),
    _opt("-t", "--tee", help="Output to log files and the console: 0-3,...", group=_OUT, default="0",
         metavar="0-3|RANK:0-3,...", shown_default="0",
         doc="output to the log files *and* the console, prefixed, whatever `--redirects` says; same values"),
    _opt("--log-line-prefix-template", help="Prefix of teed lines: ${rank}, ${local_rank}, ${hostname}...",
         group=_OUT, default="", metavar="TEMPLATE", shown_default="[${role_name}${local_rank}]:",
         doc="the prefix of each teed console line, with `${role_name}`, `${local_rank}`, `${rank}` and "
         "`${hostname}` (this node's short name) put in; else `$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`, as torchrun"),
    _opt("--local-ranks-filter", help="Show only these local ranks, e.g. 0,2.", group=_OUT, default="",
         metavar="RANKS", shown_default="all",
         doc="show only these local ranks on the console, e.g. `0` (files unaffected)"),
    _opt("--duplicate-stdout-filters", help="Copy teed stdout lines with a,b to a file.", group=_OUT, default="",
         metavar="A,B",
         doc="copy the teed stdout lines containing `a` or `b` (`,,` is a comma), prefixed, to "
         "`attempt_<n>/filtered_stdout.log`"),
    _opt("--duplicate-stderr-filters", help="The same for stderr.", group=_OUT, default="", metavar="A,B",
         doc="the same for stderr, to `filtered_stderr.log`"),
    _opt("--logs-specs", help="A LogsSpecs class (torchrun.logs_specs).", group=_OUT, env=None, metavar="NAME",
         shown_default="default",
         doc="a torch `LogsSpecs` class from the `torchrun.logs_specs` entry points, built and asked each attempt "
         "where the output goes, as torchrun does (imports torch only then)"),
    _opt("--event-log-handler", help="Agent events: null, or console (JSON).", group=_OUT, default="null",
         check=Choice(("null", "console")), shown_default="null",
         doc="`console`: one JSON object per agent event on stderr (torch's event shape: `name`, `source`, "
         "`timestamp`, `metadata`; the records `elastic-ctl history` shows)"),
    _opt("--log-format", help="The agent's lines: text, or JSON objects.", group=_OUT, default="text",
         check=Choice(("text", "json")), env="ELASTIC_LOG_FORMAT", shown_default="text", torchrun=None,
         doc="`json` (or `ELASTIC_LOG_FORMAT=json`): each of the agent's own messages one JSON object on stderr "
         "(`time`, `level`, `source`, `message`); the workers' lines untouched"),
    _opt("--http-port", help="Serve /metrics, /healthz, /readyz here.", group=_PROBES, check=Whole(0, 65535),
         metavar="PORT", shown_default="off", torchrun=None,
         doc="serve `/metrics`, `/healthz`, `/readyz` (see Metrics and probes; `0`: a free port, printed)"),
    _opt("--http-host", help="The address --http-port listens on.", group=_PROBES, default="0.0.0.0", metavar="ADDR",
         shown_default="0.0.0.0", torchrun=None,
         doc="the address `--http-port` listens on"),
    _opt("--lighthouse", help="A torchft Lighthouse replica beside the agent.", group=_TORCHFT, metavar="ID",
         shown_default="off", torchrun=None,
         doc="run a torchft Lighthouse replica of lighthouse ID beside the agent and export `TORCHFT_LIGHTHOUSE` "
         "(see torchft's Lighthouse)"),
    _opt("--lighthouse-port", help="The replica's gRPC port (0: a free one).", group=_TORCHFT, default=29510,
         check=Whole(0, 65535), metavar="PORT", shown_default="29510", torchrun=None,
         doc="the replica's gRPC port; its status page is on the next one (0: a free one for each)"),
    _opt("--lighthouse-min-replicas", help="Replica groups a quorum needs.", group=_TORCHFT, default=1,
         check=Whole(1), metavar="N", shown_default="1", torchrun=None,
         doc="replica groups a quorum needs at least (torchft's `--min_replicas`)"),
)
# fmt: on


def env_name(option: Option) -> str | None:
    """The environment variable that gives the option's default: torchrun's ``PET_<NAME>``."""
    if option.env is None:
        return None
    return option.env or "PET_" + option.name[2:].replace("-", "_").upper()


def grouped() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(--help's group title, the options it shows) in GROUP_ORDER, the options without effect apart."""
    return tuple((title, tuple(o.name for o in OPTIONS if o.group == title and o.effect)) for title in GROUP_ORDER)


def moot() -> tuple[str, ...]:
    """torchrun's options taken with no effect here (--help lists them in one line)."""
    return tuple(o.name for o in OPTIONS if not o.effect)


def check_field(name: str, value: Any) -> None:
    """The table's check of a LaunchConfig field that is an option too: one ValueError naming it."""
    option = next((o for o in OPTIONS if o.field == name), None)
    if option is None or option.check is None or (value is None and option.default is None):
        return
    why = option.check.problem(value)
    if why:
        raise ValueError(f"LaunchConfig.{name} must be {why}, not {value!r}")
