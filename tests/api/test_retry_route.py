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
from tests.support.sql import SQL


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
        rows = conn.execute(SQL["retries_of"], {"id": card["id"]}).fetchall()
    # Who asked: the key by the prefix `darkroom keys list` shows, and its owner.
    assert rows == [("retried", f"api:{key[:12]} owner=alice", "storage_unavailable")]


def test_an_admin_retries_picked_cards_of_any_owner_with_an_answer_per_card(
        local_api: Api) -> None:
    api = local_api
    root = api.make_key("ops", admin=True)
    with api.client(api.make_key("alice")) as alice, api.client(api.make_key("bob")) as bob, \
            api.client(root) as admin:
        a = confirmed(alice)
        reject(api, a["id"], ErrorCode.STORAGE_UNAVAILABLE)
        b = confirmed(bob)
        reject(api, b["id"], ErrorCode.PROCESSING_TIMEOUT)
        corrupt = confirmed(bob)
        reject(api, corrupt["id"], ErrorCode.INVALID_IMAGE)
        gone = str(uuid.uuid4())
        picked = {"ids": [a["id"], b["id"], corrupt["id"], gone, a["id"]]}

        # Owners may not, however many of their own cards they name.
        assert_problem(alice.post("/v1/queue/retry", json={"ids": [a["id"]]}), 403,
                       "forbidden")
        r = admin.post("/v1/queue/retry", json=picked)
        assert r.status_code == 200, r.text
        assert r.json() == {"queued": 2, "results": [
            {"id": a["id"], "outcome": "queued", "status": "queued"},
            {"id": b["id"], "outcome": "queued", "status": "queued"},
            {"id": corrupt["id"], "outcome": "not_retryable", "status": "rejected"},
            {"id": gone, "outcome": "not_found", "status": None},
        ]}
        # Each card is its owner's, queued as bulk work with a fresh budget.
        assert [alice.get(f"/v1/files/{a['id']}").json()[k]
                for k in ("status", "priority", "attempts")] == ["queued", "bulk", 0]
        assert bob.get(f"/v1/files/{b['id']}").json()["status"] == "queued"

        # The same request again (its answer lost): nothing queued twice.
        again = admin.post("/v1/queue/retry", json=picked)
        assert again.status_code == 200, again.text
        assert again.json()["queued"] == 0
        assert [(x["outcome"], x["status"]) for x in again.json()["results"]] == [
            ("not_rejected", "queued"), ("not_rejected", "queued"),
            ("not_retryable", "rejected"), ("not_found", None)]
    with psycopg.connect(api.db_url) as conn:
        rows = conn.execute(SQL["retries"]).fetchall()
    # The history names the admin who asked, once per card.
    assert rows == sorted([(a["id"], f"api:{root[:12]} owner=ops", "storage_unavailable"),
                           (b["id"], f"api:{root[:12]} owner=ops", "processing_timeout")])


def test_an_admin_retry_is_bounded_and_checked(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key("ops", admin=True)) as admin:
        too_many = {"ids": [str(uuid.uuid4()) for _ in range(501)]}
        assert_problem(admin.post("/v1/queue/retry", json=too_many), 422)
        assert_problem(admin.post("/v1/queue/retry", json={"ids": []}), 422)
        assert_problem(admin.post("/v1/queue/retry", json={"ids": ["not-a-uuid"]}), 422)
        assert_problem(admin.post("/v1/queue/retry", json={"code": "storage_unavailable"}),
                       422)
        most = {"ids": [str(uuid.uuid4()) for _ in range(500)]}
        r = admin.post("/v1/queue/retry", json=most)
        assert r.status_code == 200, r.text
        assert r.json()["queued"] == 0
        assert {x["outcome"] for x in r.json()["results"]} == {"not_found"}
