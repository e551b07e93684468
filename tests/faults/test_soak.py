"""The seeded fault soak (tests/faults/soak.py), short: a fixed seed unless ELASTIC_SOAK_SEED says
another, ELASTIC_SOAK_SECONDS of faults (30 by default; by hand: python -m tests.faults.soak)."""

from __future__ import annotations

import os

import pytest

from .soak import Soak

SEED = int(os.environ.get("ELASTIC_SOAK_SEED", "20261126"))
SECONDS = float(os.environ.get("ELASTIC_SOAK_SECONDS", "30"))


@pytest.mark.timeout(SECONDS + 200)
def test_a_seeded_fault_soak_keeps_every_promise(cluster, tmp_path):
    soak = Soak(cluster, str(tmp_path), SEED, SECONDS)
    try:
        report = soak.run()
    finally:
        soak.close()
    print("\n" + "\n".join(report.faults) + "\n" + report.summary())
    assert not report.problems(), "\n".join(report.problems())
