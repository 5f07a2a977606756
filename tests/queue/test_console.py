"""A card's history and an operator's pause of claiming, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from darkroom.card import Priority
from darkroom.errors import ErrorCode
from darkroom.pauses import claim_pauses, pause_claims, resume_claims
from darkroom.queue import NOTIFY_CHANNEL, PAUSED_NOTICE, Status
from darkroom.reads import Reads
from darkroom.stats import read as read_stats
from tests.queue.test_protocol import derived_for, expire, new_queued
from tests.support.services import make_queue, wait_for
from tests.support.sql import SQL


async def test_history_is_in_order_with_attempt_durations_and_pages(pool: Any) -> None:
    q = make_queue(pool, max_attempts=3, worker="w-a")
    [fid] = await new_queued(q)
    [first] = await q.claim(1)
    assert await q.fail(first, ErrorCode.STORAGE_UNAVAILABLE) is Status.QUEUED
    [second] = await q.claim(1)
    assert await q.fail(second, ErrorCode.PROCESSING_TIMEOUT) is Status.QUEUED
    [third] = await q.claim(1)
    await q.complete(third, derived_for(third))

    whole = await Reads(q.db).history(fid, "alice")
    assert whole is not None
    assert [(e.kind, e.attempt, e.error_code) for e in whole] == [
        ("claimed", 1, None), ("retry_scheduled", 1, "storage_unavailable"),
        ("claimed", 2, None), ("retry_scheduled", 2, "processing_timeout"),
        ("claimed", 3, None), ("ready", 3, None)]
    assert [e.id for e in whole] == sorted(e.id for e in whole)
    assert {e.worker for e in whole} == {"w-a"}
    # The event that ends an attempt carries its duration; a claim does not.
    for claim, end in zip(whole[::2], whole[1::2], strict=True):
        assert claim.duration_seconds is None
        assert end.duration_seconds is not None
        assert end.duration_seconds == (end.created_at - claim.created_at).total_seconds()

    # Pages of two, each after the last id of the previous: the same events, once each,
    # and a duration whose claim was on the previous page is still known.
    pages, after = [], None
    while True:
        page = await Reads(q.db).history(fid, "alice", limit=2, after=after)
        assert page is not None
        if not page:
            break
        pages.append(page)
        after = page[-1].id
    assert [len(p) for p in pages] == [2, 2, 2]
    assert [e for p in pages for e in p] == whole
    # Another owner's card is no card; an admin (owner None) sees it.
    assert await Reads(q.db).history(fid, "bob") is None
    assert await Reads(q.db).history(fid, None) == whole
    assert await Reads(q.db).history(uuid.uuid4(), None) is None


async def test_history_of_a_card_with_no_event_yet_is_empty(pool: Any) -> None:
    q = make_queue(pool)
    card = await q.create_file(owner="alice", filename="a.jpg", content_type="image/jpeg",
                               size=1)
    assert await Reads(q.db).history(card.id, "alice") == []


async def test_a_pause_stops_claims_of_its_scope_only_and_is_logged(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    alice = await new_queued(q, 2, owner="alice")
    [bob] = await new_queued(q, 1, owner="bob")

    pause, made = await pause_claims(q.db, actor="cli:ops", owner="alice")
    assert made and (pause.owner, pause.priority, pause.paused_by) == ("alice", None, "cli:ops")
    again, made = await pause_claims(q.db, actor="api:root", owner="alice")
    assert not made and again == pause  # a repeat changes nothing, not even who
    assert [lease.file_id for lease in await q.claim(5)] == [bob]

    # Every card of every owner, from another operator: nothing more is claimed.
    await pause_claims(q.db, actor="api:root")
    [carol] = await new_queued(q, 1, owner="carol")
    assert await q.claim(5) == []
    lifted = await resume_claims(q.db, actor="api:root", owner="alice")
    assert [p.owner for p in lifted] == ["alice"]
    assert await q.claim(5) == []  # the global pause still holds
    assert [p.scope() for p in await claim_pauses(q.db)] == ["every card"]
    assert [p.owner for p in await resume_claims(q.db, actor="cli:ops", every=True)] == [None]
    assert await resume_claims(q.db, actor="cli:ops", every=True) == []
    assert sorted(lease.file_id for lease in await q.claim(5)) == sorted([*alice, carol])

    with psycopg.connect(db_url) as conn:
        log = conn.execute(SQL["claim_pause_log"]).fetchall()
    assert log == [("paused", "alice", "cli:ops"), ("paused", None, "api:root"),
                   ("resumed", "alice", "api:root"), ("resumed", None, "cli:ops")]


async def test_a_pause_tells_the_workers_and_a_repeat_does_not(pool: Any) -> None:
    """Workers hand back the leases they keep ahead when told of a pause (worker.py): the
    pause that is made notifies them at its commit; its repeat, which changes nothing,
    does not."""
    q = make_queue(pool)
    async with q.db.listen(NOTIFY_CHANNEL) as notices:
        await pause_claims(q.db, actor="t", owner="alice")
        assert await asyncio.wait_for(anext(notices), timeout=30) == PAUSED_NOTICE
        await pause_claims(q.db, actor="t", owner="alice")
        await resume_claims(q.db, actor="t", owner="alice")
        assert await asyncio.wait_for(anext(notices), timeout=30) == ""  # the resume's


async def test_a_paused_priority_and_expired_leases_wait_for_the_resume(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [held] = await new_queued(q, 1, owner="alice")
    [lease] = await q.claim(1)
    bulk = await q.create_file(owner="carol", filename="b.jpg", content_type="image/jpeg",
                               size=1, priority=Priority.BULK)
    from tests.support.services import confirm
    await confirm(q, bulk.id, "carol", "v1")

    await pause_claims(q.db, actor="t", priority=Priority.BULK)
    assert await q.claim(5) == []
    await pause_claims(q.db, actor="t", owner="alice", priority=Priority.INTERACTIVE)
    expire(db_url, held)  # its worker is gone: the rescue is a new claim, held back too
    assert await q.claim(5) == []
    # The running attempt itself is not touched: it still publishes.
    await q.complete(lease, derived_for(lease))
    stats = (await read_stats(q.db)).to_json()
    assert [(p["owner"], p["priority"]) for p in stats["claim_pauses"]] == [
        (None, "bulk"), ("alice", "interactive")]
    await resume_claims(q.db, actor="t", priority=Priority.BULK)
    assert [lease.file_id for lease in await q.claim(5)] == [bulk.id]


async def test_a_pause_racing_the_same_pause_answers_the_one_that_won(
        pool: Any, db_url: str) -> None:
    """The same pause committed by another operator while this one waits on it: the
    answer is that pause (not made by this call), and only one event is written."""
    import asyncio

    q = make_queue(pool)
    with psycopg.connect(db_url) as other:
        other.execute(SQL["pause_claims_unlogged"], {"owner": "alice", "actor": "other"})
        racing = asyncio.create_task(pause_claims(q.db, actor="me", owner="alice"))

        def waiting() -> bool:
            with psycopg.connect(db_url, autocommit=True) as probe:
                row = probe.execute(SQL["lock_waiters_on"],
                                    {"text": "INSERT INTO claim_pauses"}).fetchone()
            return bool(row and row[0])

        await asyncio.to_thread(wait_for, waiting, what="the pause to wait on the other")
        other.commit()
    pause, made = await racing
    assert (pause.owner, pause.paused_by, made) == ("alice", "other", False)
    with psycopg.connect(db_url) as conn:
        assert conn.execute(SQL["claim_pause_event_count"]).fetchone() == (0,)


def test_the_paused_owners_function_covers_exactly_what_each_pause_row_covers(
        db_url: str) -> None:
    """darkroom_paused_owners, which the claim tests every card with, against the rule
    as stated (a row covers a card when its owner is NULL or the card's, and its priority
    NULL or the card's), for every set of pauses over two owners and both classes."""
    import itertools

    scopes = list(itertools.product([None, "alice", "bob"], [None, "interactive", "bulk"]))
    cards = list(itertools.product(["alice", "bob", "carol"], ["interactive", "bulk"]))
    with psycopg.connect(db_url) as conn:
        for n in range(len(scopes) + 1):
            for held in itertools.combinations(scopes, n):
                if n > 3 and n < len(scopes) - 1:
                    continue  # every set of up to 3 rows, and the nearly full ones
                conn.execute(SQL["clear_claim_pauses"])
                for owner, priority in held:
                    conn.execute(SQL["add_claim_pause"], {"owner": owner, "priority": priority})
                for owner, priority in cards:
                    row = conn.execute(SQL["held_by_a_pause"],
                                       {"owner": owner, "priority": priority}).fetchone()
                    expected = any(o in (None, owner) and p in (None, priority)
                                   for o, p in held)
                    assert row == (expected,), (held, owner, priority)
        conn.rollback()
