"""`POST /v1/files/{id}/retry` over real HTTP: an owner takes back a card rejected for a
fault that was not the file's own."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.errors import ErrorCode
from darkroom.queue import Queue
from tests.api.conftest import Api
from tests.api.helpers import assert_problem, confirmed


def reject(api: Api, file_id: str, code: ErrorCode) -> None:
    """Play a worker whose only attempt fails with `code`."""

    async def run() -> None:
        pool = await open_pool(api.db_url, min_size=1, max_size=2)
        try:
            queue = Queue(Database(pool), lease_seconds=30, max_attempts=1,
                          retry_base_seconds=0, retry_cap_seconds=0, worker="test")
            [lease] = await queue.claim(1)
            assert lease.file_id == uuid.UUID(file_id)
            assert await queue.fail(lease, code) == "rejected"
        finally:
            await pool.close()

    asyncio.run(run())


def test_an_owner_retries_a_card_rejected_for_a_transient_fault(local_api: Api) -> None:
    api = local_api
    key = api.make_key("alice")
    with api.client(key) as alice, api.client(api.make_key("bob")) as bob:
        card = confirmed(alice)
        reject(api, card["id"], ErrorCode.STORAGE_UNAVAILABLE)
        corrupt = confirmed(alice)
        reject(api, corrupt["id"], ErrorCode.INVALID_IMAGE)
        assert alice.get(f"/v1/files/{card['id']}").json()["error_code"] == "storage_unavailable"

        assert_problem(bob.post(f"/v1/files/{card['id']}/retry"), 404, "not_found")
        assert_problem(alice.post(f"/v1/files/{corrupt['id']}/retry"), 409, "not_retryable")
        r = alice.post(f"/v1/files/{card['id']}/retry")
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/v1/files/{card['id']}"
        body = r.json()
        assert (body["status"], body["error_code"], body["attempts"]) == ("queued", None, 0)
        assert body["priority"] == "interactive"
        # Not rejected any more: a second retry queues nothing.
        assert_problem(alice.post(f"/v1/files/{card['id']}/retry"), 409, "not_retryable")
        # A card that was never rejected.
        waiting = confirmed(alice)
        assert_problem(alice.post(f"/v1/files/{waiting['id']}/retry"), 409, "not_retryable")
    with psycopg.connect(api.db_url) as conn:
        rows = conn.execute("SELECT kind, worker, error_code FROM archive_events"
                            " WHERE file_id = %s AND kind = 'retried'",
                            (card["id"],)).fetchall()
    # Who asked: the key by the prefix `darkroom keys list` shows, and its owner.
    assert rows == [("retried", f"api:{key[:12]} owner=alice", "storage_unavailable")]
