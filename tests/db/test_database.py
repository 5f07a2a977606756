"""The one way in: named statements, typed rows, transactions and LISTEN."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from darkroom.db.database import Database, opened
from darkroom.layout import original_key
from darkroom.queue import NOTIFY_CHANNEL, Card, Lease, Priority, Status
from darkroom.reads import Reads
from tests.support.services import make_queue


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


async def test_listen_yields_what_is_notified_after_it_began(db_url: str) -> None:
    async with opened(db_url, name="test") as db:
        async with db.listen(NOTIFY_CHANNEL) as notifications:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("SELECT pg_notify(%s, 'hello')", (NOTIFY_CHANNEL,))
            payload = await asyncio.wait_for(anext(notifications), timeout=30)
        assert payload == "hello"


async def test_ping_answers_within_its_bound(pool: Any) -> None:
    await Database(pool).ping(timeout=30)
