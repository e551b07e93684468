"""Rendezvous settings, and their parsing from ``--rdzv-conf key=value,...`` strings.

Key names follow torch's where the meaning is the same (join_timeout, last_call_timeout,
close_timeout, read_timeout; cacert, cert, key, protocol for etcd TLS).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from rendezvous.etcd.endpoints import host_port
from rendezvous.etcd.session import default_renew_deadline, keep_alive_interval
from rendezvous.etcd.target import EtcdTarget
from rendezvous.job.keys import DEFAULT_KEY_PREFIX, validate_run_id

from .errors import RendezvousSettingsError
from .etcd import credentials

__all__ = ["RendezvousSettings", "parse_conf", "CONF_KEYS", "TORCH_ALIASES", "TORCH_IGNORED", "DEFAULT_RETENTION"]

DEFAULT_RETENTION = 3 * 24 * 3600  # seconds a finished job's keys stay (elastic-ctl history, status)
MAX_RETENTION = 365 * 24 * 3600
DEFAULT_PEER_TIMEOUT = 1.5  # seconds: a machine's death is noticed within this and one probe interval

# key -> (attribute, kind, help)
CONF_KEYS: dict[str, tuple[str, type, str]] = {
    "join_timeout": ("join_timeout", float, "seconds to wait for a round to form (default 600)"),
    "last_call_timeout": (
        "last_call_timeout",
        float,
        "seconds to wait for more nodes once min_nodes joined (default 30)",
    ),
    "close_timeout": ("close_timeout", float, "seconds to wait while marking the job closed (default 30)"),
    "read_timeout": ("read_timeout", float, "seconds each etcd request may take, failover included (default 5)"),
    "lease_ttl": (
        "lease_ttl",
        int,
        "seconds a node cut off from etcd stays a member (default 15; etcd's minimum is 2)",
    ),
    "renew_deadline": (
        "renew_deadline",
        float,
        "seconds without a lease renewal after which a node stops its workers (default lease_ttl - 1)",
    ),
    "keep_alive_interval": (
        "keep_alive_interval",
        float,
        "seconds between lease renewals (default renew_deadline / 8, at most 1; a job of more than 1024 "
        "nodes: longer in proportion, up to renew_deadline / 4)",
    ),
    "connect_timeout": (
        "connect_timeout",
        float,
        "seconds an agent waits for etcd to answer at start and after losing it (default 60)",
    ),
    "retention": (
        "retention",
        int,
        "seconds a finished or abandoned job's keys stay in etcd (default 259200, 3 days; 0: forever)",
    ),
    "peer_timeout": (
        "peer_timeout",
        float,
        "seconds a node's peers hear nothing from its agent before they end its lease "
        "(default 1.5; 0: no peer probes, a dead machine is noticed when its lease expires)",
    ),
    "probe_port": ("probe_port", int, "port this node answers its peers' probes on (default: any free port)"),
    "probe_addr": (
        "probe_addr",
        str,
        "host:port the peers probe this node at, when it is not its address and probe port (NAT, a proxy)",
    ),
    "key_prefix": ("key_prefix", str, "etcd key prefix of all jobs (default /elastic)"),
    "protocol": ("protocol", str, "http or https"),
    "cacert": ("ca_cert", str, "CA certificate file for TLS"),
    "cert": ("cert_cert", str, "client certificate file for TLS"),
    "key": ("cert_key", str, "client key file for TLS"),
    "user": ("user", str, "etcd user name"),
    "password": ("password", str, "etcd password"),
}


# torch's names (its rendezvous handlers' params) for the same settings.
TORCH_ALIASES = {
    "timeout": "join_timeout",
    "etcd_prefix": "key_prefix",
    "ca_cert": "cacert",
    "ssl_cert": "cert",
    "ssl_cert_key": "key",
}
# torch's keys that mean nothing for etcd rounds: accepted, and ignored (the lease does their work).
TORCH_IGNORED = ("heartbeat", "keep_alive_max_attempt", "is_host", "store_type", "rank", "use_libuv", "local_addr")


def _unknown_line(unknown: list[str]) -> str:
    """One line for unknown keys: "did you mean" for a near miss of a known key, else the known keys."""
    every = sorted([*CONF_KEYS, *TORCH_ALIASES, *TORCH_IGNORED])
    guesses = {key: difflib.get_close_matches(key, every, n=1, cutoff=0.75) for key in unknown}
    names = ", ".join(f"{key!r} (did you mean {guesses[key][0]!r}?)" if guesses[key] else repr(key) for key in unknown)
    line = f"unknown --rdzv-conf key{'s' if len(unknown) > 1 else ''} {names}"
    if all(guesses.values()):
        return line
    return f"{line}; known keys: {', '.join(every)}"


@dataclass(frozen=True)
class RendezvousSettings:
    run_id: str
    min_nodes: int = 1
    max_nodes: int = 1
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    read_timeout: float = 5.0
    lease_ttl: int = 15
    renew_deadline: float | None = None  # None: lease_ttl - 1
    keep_alive_interval: float | None = None  # None: renew_deadline / 8, at most 1 s
    connect_timeout: float = 60.0
    retention: int = DEFAULT_RETENTION
    peer_timeout: float | None = None  # None: DEFAULT_PEER_TIMEOUT (off when the renew deadline is under twice that)
    probe_port: int = 0
    probe_addr: str = ""
    key_prefix: str = DEFAULT_KEY_PREFIX
    protocol: str = "http"
    ca_cert: str | None = None
    cert_cert: str | None = None
    cert_key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)
        if not _is_int(self.min_nodes) or self.min_nodes < 1:
            raise RendezvousSettingsError(f"min_nodes must be a whole number >= 1, not {self.min_nodes!r}")
        if not _is_int(self.max_nodes) or self.max_nodes < self.min_nodes:
            raise RendezvousSettingsError(
                f"max_nodes ({self.max_nodes!r}) must be a whole number >= min_nodes ({self.min_nodes})"
            )
        for name in ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout", "connect_timeout"):
            value = getattr(self, name)
            lowest_ok = 0 if name == "last_call_timeout" else 1e-9
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lowest_ok <= value < float("inf"):
                raise RendezvousSettingsError(f"{name} must be a positive number of seconds, not {value!r}")
        if not _is_int(self.retention) or not 0 <= self.retention <= MAX_RETENTION:
            raise RendezvousSettingsError(
                f"retention must be whole seconds from 0 (keep forever) to {MAX_RETENTION}, not {self.retention!r}"
            )
        if not _is_int(self.lease_ttl) or not 2 <= self.lease_ttl <= 3600:
            raise RendezvousSettingsError(f"lease_ttl must be whole seconds from 2 to 3600, not {self.lease_ttl!r}")
        if self.renew_deadline is not None and not (
            _is_number(self.renew_deadline) and 0.1 <= self.renew_deadline <= self.lease_ttl - 0.5
        ):
            raise RendezvousSettingsError(
                f"renew_deadline must be from 0.1 s to lease_ttl - 0.5 ({self.lease_ttl - 0.5:g}) seconds, "
                f"not {self.renew_deadline!r}: workers must be stopped before the lease can expire"
            )
        if self.keep_alive_interval is not None and not (
            _is_number(self.keep_alive_interval) and 0.01 <= self.keep_alive_interval <= self.fence_after / 2
        ):
            raise RendezvousSettingsError(
                f"keep_alive_interval must be from 0.01 s to half the renew deadline ({self.fence_after / 2:g} s), "
                f"not {self.keep_alive_interval!r}"
            )
        self._check_probes()
        if self.protocol not in ("http", "https"):
            raise RendezvousSettingsError(f"protocol must be http or https, not {self.protocol!r}")

    def _check_probes(self) -> None:
        timeout = self.peer_timeout
        if timeout is not None and not (_is_number(timeout) and (timeout == 0 or 0.3 <= timeout <= 60)):
            raise RendezvousSettingsError(f"peer_timeout must be 0 (off) or from 0.3 to 60 seconds, not {timeout!r}")
        if not _is_int(self.probe_port) or not 0 <= self.probe_port <= 65535:
            raise RendezvousSettingsError(f"probe_port must be a port number from 0 to 65535, not {self.probe_port!r}")
        if self.probe_addr and host_port(self.probe_addr) is None:
            raise RendezvousSettingsError(f"probe_addr must be host:port, not {self.probe_addr!r}")

    @property
    def peer_window(self) -> float:
        """The peer timeout in force (0: no probes). By default probes are off when the renew deadline
        is already under twice their timeout: the lease then notices a dead machine nearly as soon."""
        if self.peer_timeout is not None:
            return float(self.peer_timeout)
        return DEFAULT_PEER_TIMEOUT if self.fence_after >= 2 * DEFAULT_PEER_TIMEOUT else 0.0

    @property
    def fence_after(self) -> float:
        """The renew deadline in force: seconds without a renewal before this node stops its workers."""
        return float(self.renew_deadline) if self.renew_deadline is not None else default_renew_deadline(self.lease_ttl)

    @property
    def renew_every(self) -> float:
        """The keep-alive interval in force."""
        if self.keep_alive_interval is not None:
            return float(self.keep_alive_interval)
        return keep_alive_interval(self.fence_after, self.max_nodes)

    @classmethod
    def from_conf(
        cls,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        conf: Mapping[str, str] | str = "",
        environ: Mapping[str, str] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> "RendezvousSettings":
        """Settings from ``--rdzv-conf`` entries (a ``k=v,...`` string or a mapping of strings), with
        etcd credentials the conf does not give taken from ``environ`` (``ELASTIC_ETCD_*``;
        ``os.environ`` by default, ``{}`` for none).

        torch's key names are accepted (``TORCH_ALIASES``, ``TORCH_IGNORED``). An unknown key is
        an error, or with ``warn`` one line given to it (the CLI's torchrun behaviour)."""
        entries = parse_conf(conf) if isinstance(conf, str) else dict(conf)
        values: dict[str, object] = dict(credentials.from_environ(os.environ if environ is None else environ))
        unknown = sorted(k for k in entries if k not in CONF_KEYS and k not in TORCH_ALIASES and k not in TORCH_IGNORED)
        if unknown:
            line = _unknown_line(unknown)
            if warn is None:
                raise RendezvousSettingsError(line)
            warn(f"ignoring {line}")  # as torchrun, which ignores keys it does not read
        for key, text in entries.items():
            key = TORCH_ALIASES.get(key, key)
            if key not in CONF_KEYS:
                continue  # torch's keys with no meaning here, and unknown ones already said
            attribute, kind, _ = CONF_KEYS[key]
            try:
                values[attribute] = kind(text)
            except (TypeError, ValueError):
                raise RendezvousSettingsError(
                    f"--rdzv-conf {key}={text!r}: expected {'a number' if kind in (int, float) else kind.__name__}"
                ) from None
        return cls(run_id=run_id, min_nodes=min_nodes, max_nodes=max_nodes, **values)

    def with_(self, **changes: object) -> "RendezvousSettings":
        return replace(self, **changes)

    def target(self, endpoints: str) -> EtcdTarget:
        """Where etcd is for ``host:port[,...]`` and how to reach it with these settings (``https://``
        added when ``protocol`` is https and an endpoint names no scheme)."""
        if self.protocol == "https":
            endpoints = ",".join(e if "://" in e else f"https://{e.strip()}" for e in endpoints.split(","))
        return EtcdTarget.of(
            endpoints,
            timeout=self.read_timeout,
            ca_cert=self.ca_cert,
            cert_key=self.cert_key,
            cert_cert=self.cert_cert,
            user=self.user,
            password=self.password,
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_conf(text: str) -> dict[str, str]:
    """``"k=v,k2=v2"`` -> ``{"k": "v", "k2": "v2"}``; an entry without ``=`` is an error."""
    entries: dict[str, str] = {}
    if not text or not text.strip():
        return entries
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # one pair of quotes, as torch's own tests pass the whole conf
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise RendezvousSettingsError(f"--rdzv-conf entry {item!r} is not key=value")
        entries[key] = value
    return entries
