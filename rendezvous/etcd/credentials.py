"""etcd credentials from the environment, so they stay off command lines (``ps``, /proc, shell history).

    ELASTIC_ETCD_USER, ELASTIC_ETCD_PASSWORD (or ELASTIC_ETCD_PASSWORD_FILE: a file holding it),
    ELASTIC_ETCD_CACERT, ELASTIC_ETCD_CERT, ELASTIC_ETCD_KEY

Used by elastic-run, elastic-ctl, the torchrun plugin and ``elastic.get_state`` alike; a value given
in ``--rdzv-conf`` (or as an argument) wins. The workers never see these variables.
"""

from __future__ import annotations

from collections.abc import Mapping

from rendezvous.errors import RendezvousSettingsError

__all__ = ["ENV_VARS", "from_environ", "without_credentials"]

# attribute of RendezvousSettings / keyword of EtcdClient -> variable
ENV_VARS = {
    "user": "ELASTIC_ETCD_USER",
    "password": "ELASTIC_ETCD_PASSWORD",
    "ca_cert": "ELASTIC_ETCD_CACERT",
    "cert_cert": "ELASTIC_ETCD_CERT",
    "cert_key": "ELASTIC_ETCD_KEY",
}
PASSWORD_FILE = "ELASTIC_ETCD_PASSWORD_FILE"


def from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The credentials the environment gives, by attribute; RendezvousSettingsError for a bad one.

    The password comes from ELASTIC_ETCD_PASSWORD or from the file ELASTIC_ETCD_PASSWORD_FILE
    names (its trailing newline dropped), not both.
    """
    found = {attribute: environ[name] for attribute, name in ENV_VARS.items() if environ.get(name)}
    path = environ.get(PASSWORD_FILE)
    if path:
        if "password" in found:
            raise RendezvousSettingsError(f"set ELASTIC_ETCD_PASSWORD or {PASSWORD_FILE}, not both")
        try:
            with open(path, encoding="utf-8") as handle:
                found["password"] = handle.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not a text file"
            raise RendezvousSettingsError(f"{PASSWORD_FILE}={path!r} cannot be read: {reason}") from None
    return found


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less every credential variable (what a worker process is given)."""
    secret = set(ENV_VARS.values()) | {PASSWORD_FILE}
    return {name: value for name, value in environ.items() if name not in secret}
