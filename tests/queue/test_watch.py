"""The pages' watch (darkroom/watch.py): status changes notify the pages only while it is
on, and turning it on lets no change slip between the notices and a page's read."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import psycopg
import pytest

from darkroom.db.connection import open_pool
from darkroom.db.database import CONNECTION_ERRORS, Database
from darkroom.db.queries import QUERIES
from darkroom.watch import Watch
from tests.queue.test_card_notices import notices
from tests.queue.test_fair import add
from tests.support.faults import through_proxy
from tests.support.services import make_queue, wait_until
from tests.support.sql import SQL


async def test_with_no_page_watching_status_changes_send_nothing(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [first, second] = await add(q, "a", 2)

    async def claim_one() -> None:
        assert len(await q.claim(1)) == 1

    assert await notices(q, db_url, claim_one) == []
    await Watch(q.db).turn_on()
    got = await notices(q, db_url, claim_one)
    assert got == [["a", str(second), "processing"]] or got == [["a", str(first), "processing"]]


async def test_turning_the_watch_on_waits_for_a_change_that_read_it_off(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await add(q, "a")
    watch = Watch(q.db)
    order: list[str] = []
    written, commit = asyncio.Event(), asyncio.Event()

    async def delete_slowly() -> None:
        # A status change that reads the watch as off, then takes its time to commit.
        async with q.db.transaction() as tx:
            assert await tx.rows("revoke", {"id": fid, "owner": "a"})
            written.set()
            await commit.wait()
            order.append("committed")

    async def turn_on() -> None:
        await watch.turn_on()
        order.append("on")

    async def scenario() -> None:
        writer = asyncio.create_task(delete_slowly())
        await asyncio.wait_for(written.wait(), 30)
        on = asyncio.create_task(turn_on())
        await wait_until(lambda: on.done() or watch.waiting_for == 1,
                         what="the watch to wait for the change")
        assert not on.done()
        commit.set()
        await asyncio.wait_for(asyncio.gather(writer, on), 30)

    # The change was not notified (it read the watch as off) ...
    assert await notices(q, db_url, scenario) == []
    assert order == ["committed", "on"]
    # ... and a page's read after the watch is on sees it.
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(SQL["card_statuses"]).fetchall() == [(fid, "deleting")]


async def test_the_watch_stays_on_while_it_waits_for_a_long_change(
        pool: Any, db_url: str) -> None:
    # A change may hold its lock for as long as its statement timeout: the watch must not
    # end meanwhile, or the changes made after it did would go unnotified.
    q = make_queue(pool)
    [fid] = await add(q, "a")
    now = [0.0]
    watch = Watch(q.db, seconds=60, margin=5, clock=lambda: now[0])
    written, commit = asyncio.Event(), asyncio.Event()

    def until() -> Any:
        with psycopg.connect(db_url, autocommit=True) as conn:
            return conn.execute(SQL["card_watch_until"]).fetchone()

    async def delete_slowly() -> None:
        async with q.db.transaction() as tx:
            await tx.rows("revoke", {"id": fid, "owner": "a"})
            written.set()
            await commit.wait()

    writer = asyncio.create_task(delete_slowly())
    await asyncio.wait_for(written.wait(), 30)
    on = asyncio.create_task(watch.turn_on())
    await wait_until(lambda: on.done() or watch.waiting_for == 1, what="the wait")
    first = until()
    now[0] = 50.0  # an extension is due while the change still runs
    await wait_until(lambda: until() > first, what="the watch to be extended")
    now[0] = 100.0  # past the first extension's reckoning
    commit.set()
    await asyncio.wait_for(asyncio.gather(writer, on), 30)
    assert watch.is_on()


async def test_a_watch_extended_after_its_reckoned_end_is_owed_the_wait(pool: Any) -> None:
    q = make_queue(pool)
    now = [1000.0]
    watch = Watch(q.db, seconds=60, margin=5, clock=lambda: now[0])
    assert not watch.is_on()
    assert await watch.extend() is False  # never on before
    assert watch.is_on()
    now[0] += 30
    assert await watch.extend() is True  # within the reckoned 55 s
    now[0] += 100
    assert not watch.is_on()
    assert await watch.extend() is False  # past it: there may have been a gap


async def test_the_watch_never_ends_earlier_for_a_shorter_extension(pool: Any,
                                                                    db_url: str) -> None:
    q = make_queue(pool)
    await Watch(q.db, seconds=600, margin=5).extend()
    with psycopg.connect(db_url, autocommit=True) as conn:
        long = conn.execute(SQL["card_watch_until"]).fetchone()
    await Watch(q.db, seconds=10, margin=5).extend()
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(SQL["card_watch_until"]).fetchone() == long


def test_every_statement_that_notifies_the_pages_writes_the_cards() -> None:
    # turn_on finds the changes that read the watch as off by their write lock on
    # archive_files: a statement that notified without one would not be waited for.
    notifying = [name for name, sql in QUERIES.items() if "darkroom_notify_cards" in sql]
    assert len(notifying) >= 10
    for name in notifying:
        assert re.search(r"\bUPDATE archive_files\b", QUERIES[name]), name


def test_every_statement_that_notifies_the_pages_asks_first_whether_one_watches() -> None:
    # With no page open, a batch's statement builds no list of its changes for them.
    for name, sql in QUERIES.items():
        calls = sql.count("darkroom_notify_cards(")
        guarded = len(re.findall(
            r"CASE WHEN darkroom_cards_watched\(\) THEN \(\s*SELECT darkroom_notify_cards\(",
            sql))
        assert calls == guarded, name


async def test_a_vacuum_of_the_cards_is_not_waited_for(pool: Any, db_url: str) -> None:
    # VACUUM, ANALYZE and an index built concurrently hold their lock for minutes and
    # change no card: turning the watch on does not wait for them.
    q = make_queue(pool)
    with psycopg.connect(db_url) as vacuum:
        vacuum.execute(SQL["lock_cards_like_vacuum"])
        watch = Watch(q.db)
        await asyncio.wait_for(watch.turn_on(), 20)
        assert watch.is_on()
        vacuum.rollback()


async def test_a_watch_found_ended_by_the_databases_clock_is_owed_the_wait(
        pool: Any, db_url: str) -> None:
    # This process reckons the watch on, but by the database's clock (the one every
    # change compares it with) it ended: a change may have read it as off.
    q = make_queue(pool)
    watch = Watch(q.db)
    await watch.turn_on()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["end_card_watch"])
    assert watch.is_on()
    assert await watch.extend() is False
    assert await watch.extend() is True


@pytest.mark.parametrize("where", ["before", "after"])
async def test_an_extension_whose_answer_was_lost_is_asked_again(db_url: str, where: str) -> None:
    """An extension cut at the socket, not committed or committed with its answer lost,
    fails; asked again within this process's reckoning it finds the watch unbroken, and the
    end never moved back."""
    proxy, url = through_proxy(db_url)
    pool = await open_pool(url, min_size=1, max_size=1)
    try:
        watch = Watch(Database(pool))
        assert await watch.extend() is False  # the first one owes the wait
        with psycopg.connect(db_url, autocommit=True) as conn:
            first = conn.execute(SQL["card_watch_until"]).fetchone()
        proxy.cut_statement(b"UPDATE card_watch", where=where)
        with pytest.raises(CONNECTION_ERRORS):
            await watch.extend()
        assert not proxy.statement_cut_pending
        with psycopg.connect(db_url, autocommit=True) as conn:
            cut = conn.execute(SQL["card_watch_until"]).fetchone()
        assert first is not None and cut is not None
        assert (cut[0] > first[0]) is (where == "after")
        assert await watch.extend() is True
        assert watch.is_on()
        with psycopg.connect(db_url, autocommit=True) as conn:
            last = conn.execute(SQL["card_watch_until"]).fetchone()
        assert last is not None and last[0] > cut[0]
    finally:
        await pool.close()
        proxy.close()
