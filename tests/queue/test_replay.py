"""A replayed create is a replay, even when the owner is at its quota."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from darkroom.db.queries import QUERIES
from darkroom.layout import original_key
from darkroom.queue import QuotaExceeded
from darkroom.uploads import Uploads, key_hash, request_hash
from tests.support.services import make_queue, wait_for
from tests.support.sql import SQL

FIELDS = {"filename": "a.jpg", "content_type": "image/jpeg", "size": 10, "sha256": None,
          "allow_duplicate": False}


def waiting_on_the_quota_lock(db_url: str) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(SQL["advisory_lock_waiters"]).fetchone()
    return row is not None and row[0] > 0


async def test_a_create_replayed_while_the_first_commits_at_the_quota_answers_its_card(
        pool: Any, db_url: str) -> None:
    """The first create (one file of a quota of one) is still committing when its retry,
    same key, looks the key up (not there yet) and waits for the owner's quota lock. The
    retry then answers the first card, not `quota_exceeded`."""
    q = make_queue(pool)
    uploads = Uploads(q.db)
    first_id = uuid.uuid4()
    first = psycopg.connect(db_url)
    try:
        first.execute(QUERIES["lock_owner_quota"], {"owner": "alice"})
        first.execute(QUERIES["create_file"], {
            "id": first_id, "owner": "alice", "filename": "a.jpg",
            "content_type": "image/jpeg", "size": 10,
            "original_key": original_key(first_id, "alice"),
            "sha256": None, "key_hash": key_hash("k-1"), "request_hash": request_hash(FIELDS),
            "priority": "interactive"})
        retried = asyncio.ensure_future(uploads.create(
            q, owner="alice", filename="a.jpg", content_type="image/jpeg", size=10,
            sha256=None, allow_duplicate=False, key="k-1", fields=FIELDS, quota_files=1))
        await asyncio.to_thread(wait_for, lambda: waiting_on_the_quota_lock(db_url),
                                timeout=30, what="the retry to wait for the quota lock")
        assert not retried.done()
        first.commit()
        created = await asyncio.wait_for(retried, 30)
    finally:
        first.close()
    assert created.replayed and created.card.id == first_id
    with psycopg.connect(db_url) as conn:
        assert conn.execute(SQL["card_count"]).fetchone() == (1,)
    # A new create past the quota is still refused.
    with pytest.raises(QuotaExceeded):
        await uploads.create(q, owner="alice", filename="b.jpg", content_type="image/jpeg",
                             size=10, sha256=None, allow_duplicate=False, key="k-2",
                             fields={**FIELDS, "filename": "b.jpg"}, quota_files=1)
