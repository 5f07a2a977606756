"""The multi-host rehearsal of bench/hosts.py in a reduced size: real network namespaces,
real partitions, every fault kind, the same end-state checks as the chaos run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.hosts import LEASE, Network, run


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_hosts_rehearsal_reduced(tmp_path: Path) -> None:
    reason = Network.unavailable()
    if reason:
        pytest.skip(f"multi-host rehearsal: {reason}")
    if os.environ.get("DARKROOM_TEST_DATABASE_URL"):
        pytest.skip("the rehearsal runs its own PostgreSQL on a host of its own")
    result = run(files=150, seed=11, tmp=tmp_path)
    assert result.outcome.problems == []
    hf = result.faults
    assert hf.link_cut_leases_held >= 1 and hf.link_cut_seconds > LEASE
    assert hf.readyz_during_db_cut.get("503", 0) >= 1
    assert hf.accepted_202_after_db_heal_s is not None
    assert hf.host_kill_processes >= 1
    assert result.outcome.max_starts <= 8
