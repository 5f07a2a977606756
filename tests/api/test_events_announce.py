"""Card notifications only while a hub has announced that it listens (migration 0022),
and a hub that cannot tell its announce held waits for what ran before its pages read."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest

from darkroom.api import events
from darkroom.api.events import CHANNEL, Hub
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.queue import claim_params
from tests.queue.test_protocol import new_queued
from tests.support.services import make_queue, wait_for
from tests.support.sql import SQL

MARK = '{"o": []}'  # a notification of the test's own: it names no owner
RESYNC = {"type": "resync"}


def mark(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["notify_cards_channel"], {"payload": MARK})


def holds(db_url: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(SQL["announce_holds"]).fetchone()
        return bool(row and row[0])


async def until(db_url: str, state: bool) -> None:
    await asyncio.to_thread(wait_for, lambda: holds(db_url) is state, timeout=30,
                            what=f"an announce to hold: {state}")


def unnotified_claim(conn: psycopg.Connection[Any]) -> None:
    """A claim left open, made while no announce held: it notified nobody."""
    params = claim_params(n=1, claim=uuid.uuid4(), max_attempts=3, lease_seconds=60,
                          worker="w", bulk_share=0.1)
    assert conn.execute(QUERIES["claim"], params).fetchall()


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
    await q.db.row("announce_listener", {"seconds": 60})
    [note] = await heard(q.db, db_url, lambda: q.claim(1))
    assert [status for _, _, status in json.loads(note)["c"]] == ["processing"]


async def test_a_first_stream_opens_once_the_transactions_running_have_ended(
        pool: Any, db_url: str) -> None:
    """A claim that read no announce changed a card and has not committed: the page may
    read only once it has, or it would miss that change for good."""
    q = make_queue(pool)
    await new_queued(q, 1)
    hub = Hub(q.db, ping_seconds=30)
    try:
        with psycopg.connect(db_url) as running:
            unnotified_claim(running)
            subscribing = asyncio.create_task(hub.subscribe("alice"))
            await until(db_url, True)
            await asyncio.sleep(0)
            assert not subscribing.done()
            running.commit()
        page = await asyncio.wait_for(subscribing, timeout=30)
        assert page.empty()  # it reads now, after the claim: nothing to re-read
    finally:
        hub.close()


async def test_past_the_settle_time_the_pages_re_read_once_the_transaction_ends(
        pool: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "SETTLE_SECONDS", 0.05)
    q = make_queue(pool)
    await new_queued(q, 1)
    hub = Hub(q.db, ping_seconds=30)
    try:
        with psycopg.connect(db_url) as running:
            unnotified_claim(running)
            page = await hub.subscribe("alice")  # answers past the settle time
            assert page.empty()
            running.commit()
        assert await asyncio.wait_for(page.get(), timeout=30) == RESYNC
    finally:
        hub.close()


async def test_a_second_hub_waits_too_while_the_first_announce_settles(
        pool: Any, db_url: str) -> None:
    """Two API processes: the second finds the announce holding, but cannot tell it held
    all along, so its page too reads only after the unnotified claim committed."""
    q = make_queue(pool)
    await new_queued(q, 1)
    first, second = Hub(q.db, ping_seconds=30), Hub(q.db, ping_seconds=30)
    try:
        with psycopg.connect(db_url) as running:
            unnotified_claim(running)
            subscribing = asyncio.create_task(first.subscribe("alice"))
            await until(db_url, True)
            other = asyncio.create_task(second.subscribe("alice"))
            await asyncio.sleep(0)
            assert not other.done()
            running.commit()
        for task in (subscribing, other):
            page = await asyncio.wait_for(task, timeout=30)
            assert page.empty()  # each reads after the claim committed
    finally:
        first.close()
        second.close()


async def test_open_pages_re_read_when_a_new_stream_finds_the_announce_lapsed(
        pool: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No renewal came in time (a busy pool, a stalled loop): a claim committed without
    notifying, and the next announce tells every open page to re-read, not only the new."""
    monkeypatch.setattr(events, "ANNOUNCE_SECONDS", 1)
    monkeypatch.setattr(events, "RENEW_SECONDS", 3600.0)
    q = make_queue(pool)
    await new_queued(q, 1)
    hub = Hub(q.db, ping_seconds=30)
    try:
        page = await hub.subscribe("alice")
        await until(db_url, False)
        assert await q.claim(1)  # committed, unnotified
        await hub.subscribe("bob")
        assert await asyncio.wait_for(page.get(), timeout=30) == RESYNC
    finally:
        hub.close()


async def test_an_announce_the_pool_holds_up_is_not_given_up(
        pool: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream opens without waiting for a busy pool; the announce goes on, and its
    settle ends in a re-read once the unnotified claim committed."""
    monkeypatch.setattr(events, "ANNOUNCE_WAIT_SECONDS", 0.05)
    q = make_queue(pool)
    await new_queued(q, 1)
    hub_pool = await open_pool(db_url, min_size=1, max_size=1, wait_seconds=30)
    hub = Hub(Database(hub_pool), ping_seconds=30)
    try:
        with psycopg.connect(db_url) as running:
            unnotified_claim(running)
            async with hub_pool.connection():  # busy: the announce waits for it
                page = await hub.subscribe("alice")
            running.commit()
        assert await asyncio.wait_for(page.get(), timeout=30) == RESYNC
    finally:
        hub.close()
        await hub_pool.close()
