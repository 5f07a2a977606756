"""The chaos run of bench/chaos.py in a reduced size: every invariant, every fault kind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.chaos import run

# A fleet of real processes: not in `make test-fast`.
pytestmark = pytest.mark.fleet


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_chaos_run_reduced(tmp_path: Path) -> None:
    if os.environ.get("DARKROOM_TEST_DATABASE_URL"):
        pytest.skip("the chaos run restarts its own PostgreSQL")
    outcome = run(files=160, seed=11, tmp=tmp_path)
    assert outcome.problems == []
    tally = outcome.tally
    assert tally.kills >= 1 and tally.freezes == 1
    assert tally.pg_restarts == 1 and tally.s3_freezes == 1
    assert tally.s3_stalls == 1 and tally.s3_outages == 1
    assert tally.s3_partial_outages == 1
    assert tally.cuts_before >= 1 and tally.cuts_after >= 1
    assert outcome.max_starts <= 8
    # Every server the run started is gone with it (its PostgreSQL included).
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit()
                 and str(tmp_path) in _cmdline(pid)]
    assert leftovers == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
