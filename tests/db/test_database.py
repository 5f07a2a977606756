"""The one way in: named statements, typed rows, transactions and LISTEN."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from darkroom.db.database import Database, opened
from darkroom.layout import original_key
from darkroom.queue import NOTIFY_CHANNEL, Card, Derived, Lease, Priority, Status
from darkroom.reads import Reads
from tests.support.services import make_queue
from tests.support.sql import SQL


async def test_rows_are_built_by_column_name(pool: Any) -> None:
    q = make_queue(pool)
    card = await q.create_file(owner="o", filename="a.jpg", content_type="image/jpeg", size=1)
    assert isinstance(card, Card) and card.status is Status.PENDING
    await q.confirm_card(card.id, "o", "v1")
    [lease] = await q.claim(1)
    assert isinstance(lease, Lease)
    assert (lease.file_id, lease.owner, lease.original_version) == (card.id, "o", "v1")


async def test_a_transaction_that_fails_commits_nothing(pool: Any) -> None:
    db = Database(pool)
    file_id = uuid.uuid4()
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with db.transaction() as tx:
            params = {"id": file_id, "owner": "o", "filename": "a.jpg",
                      "content_type": "image/jpeg", "size": 1,
                      "original_key": original_key(file_id, "o"), "priority": str(Priority.BULK),
                      "sha256": None, "key_hash": None, "request_hash": None}
            await tx.rows("create_file", params)
            await tx.rows("create_file", params)  # the same id again: the whole block fails
    assert await Reads(Database(pool)).get_file(file_id, "o") is None


async def test_statements_sent_together_commit_together_or_not_at_all(pool: Any) -> None:
    """`together` sends its statements in one pipeline with no transaction block of its
    own: the first commits with the second, and not at all when the second fails."""
    db = Database(pool)

    def card(file_id: uuid.UUID) -> dict[str, Any]:
        return {"id": file_id, "owner": "o", "filename": "a.jpg", "content_type": "image/jpeg",
                "size": 1, "original_key": original_key(file_id, "o"),
                "priority": str(Priority.BULK), "sha256": None, "key_hash": None,
                "request_hash": None}

    first, second = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(psycopg.errors.UniqueViolation):
        await db.together(("create_file", card(first), None),
                          ("create_file", card(first), None))
    assert await Reads(db).get_file(first, "o") is None
    made = await db.together(("create_file", card(first), Card),
                             ("create_file", card(second), Card))
    assert [[c.id for c in rows] for rows in made] == [[first], [second]]
    for file_id in (first, second):
        assert await Reads(db).get_file(file_id, "o") is not None
    # The connection went back to the pool idle, in no transaction.
    async with pool.connection() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_listen_yields_what_is_notified_after_it_began(db_url: str) -> None:
    async with opened(db_url, name="test") as db:
        async with db.listen(NOTIFY_CHANNEL) as notifications:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("SELECT pg_notify(%s, 'hello')", (NOTIFY_CHANNEL,))
            payload = await asyncio.wait_for(anext(notifications), timeout=30)
        assert payload == "hello"


async def test_ping_answers_within_its_bound(pool: Any) -> None:
    await Database(pool).ping(timeout=30)


@pytest.mark.parametrize("generic", [False, True])
async def test_a_workers_connection_plans_its_fenced_commit_once(
        db_url: str, generic: bool) -> None:
    """A worker's pool keeps the generic plan of each statement: its fenced commit of one
    result is not planned again at every execution, as PostgreSQL's default mode does
    for a statement over arrays once the table holds a backlog (connection.GENERIC_PLANS)."""
    ids = [uuid.uuid4() for _ in range(20_000)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["seed_queued"], {"owner": "o", "ids": ids,
                                          "keys": [original_key(i, "o") for i in ids]})
        conn.execute(SQL["analyze_cards"])
    db = await Database.open(db_url, name="plans", max_size=1, generic_plans=generic)
    try:
        q = make_queue(db.pool)
        for _ in range(8):
            [lease] = await q.claim(1)
            await q.complete(lease, Derived(f"k-{lease.token}", "v", "0" * 64, 1, 1, 1))
        async with db.pool.connection() as conn:
            rows = await (await conn.execute(SQL["plans_of_prepared"])).fetchall()
    finally:
        await db.close()
    # The statement as the server holds it ($1 for each parameter): the common case's
    # (`publish`), known by the fence only it holds.
    [complete] = [r for r in rows if "f.thumb_key IS NULL RETURNING" in r["statement"]]
    if generic:
        assert complete["custom_plans"] == 0 and complete["generic_plans"] == 8
    else:  # why a worker asks for it
        assert complete["custom_plans"] == 8
