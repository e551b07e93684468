"""Where etcd is and how to reach it, as one frozen value: the endpoints (each with its scheme), the
time every call may take, the TLS files and the user. Built once (``RendezvousSettings.target``, or
from a helper process's JSON) and handed to every client; its JSON form is what a helper process is
given (the reaper), so nothing is turned back into option strings on the way. ``EtcdClient(target)``
connects to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from rendezvous.errors import RendezvousSettingsError

from .endpoints import Endpoint, parse_endpoints

__all__ = ["EtcdTarget", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 5.0


@dataclass(frozen=True)
class EtcdTarget:
    endpoints: tuple[Endpoint, ...]
    timeout: float = DEFAULT_TIMEOUT  # seconds each call may take, failover included
    ca_cert: str | None = None
    cert_key: str | None = None
    cert_cert: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise RendezvousSettingsError("no etcd endpoint given")
        if not self.timeout or self.timeout <= 0:
            raise RendezvousSettingsError(f"etcd timeout must be a positive number of seconds, not {self.timeout!r}")
        if (self.user is None) != (self.password is None):
            raise RendezvousSettingsError("etcd user and password go together: give both or neither")
        if (self.cert_key is None) != (self.cert_cert is None):
            raise RendezvousSettingsError("etcd client certificate and key go together: give both or neither")
        object.__setattr__(self, "timeout", float(self.timeout))

    @classmethod
    def of(cls, endpoints: str | tuple[Endpoint, ...], **options: Any) -> "EtcdTarget":
        """From ``host:port[,...]`` (``https://`` where TLS) or parsed endpoints, and the options' fields."""
        return cls(parse_endpoints(endpoints) if isinstance(endpoints, str) else tuple(endpoints), **options)

    @property
    def files(self) -> tuple[str | None, str | None, str | None]:
        """(CA certificate, client key, client certificate): what the channels are made with."""
        return self.ca_cert, self.cert_key, self.cert_cert

    @property
    def urls(self) -> str:
        """``http://h:p,https://h2:p2``: the endpoints as a client (or ``--rdzv-endpoint``) takes them."""
        return ",".join(f"{'https' if ep.secure else 'http'}://{ep.target}" for ep in self.endpoints)

    def with_timeout(self, timeout: float) -> "EtcdTarget":
        return replace(self, timeout=timeout)

    def to_json(self) -> str:
        """For a helper process (it holds the password: hand it over a pipe, never argv)."""
        data = asdict(self)
        data["endpoints"] = self.urls
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EtcdTarget":
        try:
            data = json.loads(text)
            return cls.of(data.pop("endpoints"), **data)
        except RendezvousSettingsError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RendezvousSettingsError(f"not an etcd target: {exc}") from None
