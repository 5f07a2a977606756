"""How a claim commits: on its own, without waiting for the WAL's flush (a lost claim is
fenced); sent with a batch's publications, as they do, waiting for it. Seen on the wire,
between the queue and a real PostgreSQL, by a `FaultProxy` that records each round trip.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import darkroom
from darkroom.db.connection import open_pool
from darkroom.db.queries import QUERIES
from darkroom.queue import Queue
from tests.queue.test_protocol import derived_for, new_queued
from tests.support.faults import FaultProxy, through_proxy
from tests.support.services import make_queue

LAZY = b"set_config('synchronous_commit', 'off', true)"
CLAIM = b"headed AS ("  # a fragment only the claim's text holds
PUBLISH = b"f.thumb_key IS NULL RETURNING"


@pytest.fixture
async def watched(db_url: str) -> AsyncIterator[tuple[FaultProxy, Queue]]:
    proxy, url = through_proxy(db_url)
    pool = await open_pool(url, min_size=1, max_size=2)
    try:
        yield proxy, make_queue(pool)
    finally:
        await pool.close()
        proxy.close()


def rounds_with(proxy: FaultProxy, fragment: bytes) -> list[list[bytes]]:
    return [r for r in proxy.rounds() if any(fragment in text for text in r)]


async def test_a_claim_on_its_own_commits_without_waiting_for_the_flush(
        watched: tuple[FaultProxy, Queue]) -> None:
    proxy, q = watched
    await new_queued(q, 2)
    assert len(await q.claim(2)) == 2
    [claim_round] = rounds_with(proxy, CLAIM)
    assert len(claim_round) == 2
    assert LAZY in claim_round[0] and CLAIM in claim_round[1]


async def test_a_claim_sent_with_publications_waits_for_the_flush(
        watched: tuple[FaultProxy, Queue]) -> None:
    proxy, q = watched
    await new_queued(q, 2)
    [lease] = await q.claim(1)
    lost, leases = await q.complete_and_claim([(lease, derived_for(lease))], 1)
    assert lost == set() and len(leases) == 1
    [together] = rounds_with(proxy, PUBLISH)
    assert [PUBLISH in together[0], CLAIM in together[1]] == [True, True]
    assert not any(LAZY in text for text in together)


def test_only_a_claim_on_its_own_commits_lazily() -> None:
    # A publication, a failure, a confirm... must wait for their flush: the lazy commit is
    # sent by one call, Queue.claim, and is a statement of its own.
    package = Path(darkroom.__file__).parent
    uses = [(path.name, line) for path in sorted(package.rglob("*.py"))
            for line in path.read_text().splitlines() if '"commit_lazily"' in line]
    assert [name for name, _ in uses] == ["queue.py"], uses
    assert [name for name, sql in QUERIES.items()
            if re.search(r"synchronous_commit", sql)] == ["commit_lazily"]

