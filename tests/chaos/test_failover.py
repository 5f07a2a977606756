"""The failover rehearsal of bench/failover.py, reduced: synchronous replication loses
nothing that was acknowledged, and every process follows the promotion by itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.failover import MAX_ATTEMPTS, run

# A fleet of real processes and two PostgreSQL servers: not in `make test-fast`.
pytestmark = pytest.mark.fleet

# Fewer files than the benchmark's 500 (bench/failover.py), to keep the slow lane short;
# the kill still lands mid-run, with work in every state.
FILES = 150


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_promoted_synchronous_standby_loses_no_acknowledged_confirm(tmp_path: Path) -> None:
    outcome = run(FILES, synchronous=True, tmp=tmp_path)
    assert outcome.problems == []
    # The kill came mid-run: some confirms were acknowledged before it, some after.
    assert outcome.kill_after_seconds > 0 and 0 < outcome.acked <= FILES
    assert outcome.ready_before_kill > 0
    # Nothing the old primary acknowledged is missing from the promoted standby.
    assert (outcome.lost_acked_confirms, outcome.lost_creates, outcome.lost_published) == (
        0, 0, 0)
    assert outcome.originals_deleted == 0 and outcome.restored == 0
    assert 1 <= outcome.max_starts <= MAX_ATTEMPTS
    # Work went on within seconds of the kill, without restarting anything; the page's
    # open event stream was told to re-read, then saw the new primary's changes.
    assert outcome.reconnect_seconds < 30
    assert outcome.stream_resynced and outcome.stream_events_after_kill > 0
