"""etcd endpoints: ``host:port[,host:port...]`` parsed into ``Endpoint``s (IPv6 in brackets, a
``http://`` or ``https://`` scheme allowed, the default port 2379)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rendezvous.errors import RendezvousSettingsError

__all__ = ["DEFAULT_PORT", "Endpoint", "parse_endpoints", "host_port"]

DEFAULT_PORT = 2379
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+))(?::(?P<port>[^:]*))?$")


@dataclass(frozen=True)
class Endpoint:
    """One etcd client URL: host, port, and whether it speaks TLS."""

    host: str
    port: int = DEFAULT_PORT
    secure: bool = False

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.target


def host_port(text: str) -> Endpoint | None:
    """``host:port`` (an IPv6 host in brackets) with its port, as a peer probe endpoint is written;
    None when ``text`` is not one."""
    match = _HOST_PORT.match(text) if isinstance(text, str) else None
    port = match.group("port") if match is not None else None
    if port is None or not (port.isdigit() and 0 < int(port) < 65536):
        return None
    return Endpoint(match.group("v6") or match.group("host"), int(port))


def parse_endpoints(text: str, default_port: int = DEFAULT_PORT) -> tuple[Endpoint, ...]:
    """Parse ``host[:port][,host[:port]...]`` (an ``http://`` or ``https://`` scheme is allowed).

    Raises RendezvousSettingsError naming the offending entry.
    """
    if not isinstance(text, str) or not text.strip():
        raise RendezvousSettingsError("etcd endpoint is empty; expected host:port[,host:port...]")
    endpoints = []
    for raw in text.split(","):
        item = raw.strip()
        secure = False
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*)://", item)
        if scheme:
            name = scheme.group(1).lower()
            if name not in ("http", "https"):
                raise RendezvousSettingsError(
                    f"etcd endpoint {item!r}: scheme {name!r} is not supported (use http or https)"
                )
            secure = name == "https"
            item = item[scheme.end() :].rstrip("/")
        match = _HOST_PORT.match(item)
        if not item or match is None:
            raise RendezvousSettingsError(f"etcd endpoint {raw.strip()!r} is not host[:port]")
        host = match.group("v6") or match.group("host")
        port_text = match.group("port")
        if port_text is None:
            port = default_port
        elif port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise RendezvousSettingsError(
                f"etcd endpoint {raw.strip()!r}: port {port_text!r} is not a number from 1 to 65535"
            )
        endpoints.append(Endpoint(host, port, secure))
    return tuple(endpoints)
