"""Card notifications only while a hub has announced that it listens (migration 0022),
and a hub's announce after a lapse waits for what ran before it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest

from darkroom.api import events
from darkroom.api.events import CHANNEL, Hub
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.queue import claim_params
from tests.queue.test_protocol import new_queued
from tests.support.services import make_queue, wait_for
from tests.support.sql import SQL

MARK = '{"o": []}'  # a notification of the test's own: it names no owner


def mark(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["notify_cards_channel"], {"payload": MARK})


async def heard(db: Database, db_url: str, during: Any) -> list[str]:
    """The card notifications sent by `during()`, in order: a mark sent after it commits
    arrives after all of them (notifications come in commit order)."""
    async with db.listen(CHANNEL) as notes:
        await during()
        await asyncio.to_thread(mark, db_url)
        got = []
        while (note := await asyncio.wait_for(anext(notes), timeout=30)) != MARK:
            got.append(note)
        return got


async def test_nobody_announced_nothing_is_sent_and_an_announce_brings_them_back(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q, 2)
    assert await heard(q.db, db_url, lambda: q.claim(1)) == []
    await q.db.row("listen_until", {"seconds": 60})
    [note] = await heard(q.db, db_url, lambda: q.claim(1))
    assert [status for _, _, status in json.loads(note)["c"]] == ["processing"]


async def test_an_announce_after_a_lapse_waits_for_the_transactions_already_running(
        pool: Any, db_url: str) -> None:
    """A claim that read no announce changed a card and has not committed: the hub's
    pages may read only once it has, or they would miss that change for good."""
    q = make_queue(pool)
    await new_queued(q, 1)
    hub = Hub(q.db, ping_seconds=30)
    with psycopg.connect(db_url) as running:
        params = claim_params(n=1, claim=uuid.uuid4(), max_attempts=3,
                              lease_seconds=60, worker="w", bulk_share=0.1)
        assert running.execute(QUERIES["claim"], params).fetchall()  # open, unnotified
        announcing = asyncio.create_task(hub._announce())
        with psycopg.connect(db_url, autocommit=True) as probe:
            await asyncio.to_thread(
                wait_for, lambda: probe.execute(SQL["announce_holds"]).fetchone() == (True,),
                timeout=30, what="the hub to announce")
        await asyncio.sleep(0)
        assert not announcing.done()
        running.commit()
    assert await asyncio.wait_for(announcing, timeout=30) is True  # it had lapsed


async def test_past_the_settle_time_the_pages_re_read_once_the_transaction_ends(
        pool: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "SETTLE_SECONDS", 0.05)
    q = make_queue(pool)
    await new_queued(q, 1)
    hub = Hub(q.db, ping_seconds=30)
    with psycopg.connect(db_url) as running:
        params = claim_params(n=1, claim=uuid.uuid4(), max_attempts=3,
                              lease_seconds=60, worker="w", bulk_share=0.1)
        assert running.execute(QUERIES["claim"], params).fetchall()
        page = await hub.subscribe("alice")  # answers past the settle time
        assert page.empty()
        running.commit()
    try:
        assert await asyncio.wait_for(page.get(), timeout=30) == {"type": "resync"}
    finally:
        hub.close()
