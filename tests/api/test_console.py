"""The operator's routes over real HTTP: a card's history, pause and resume, and the
rejected cards by code."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.errors import ErrorCode
from darkroom.queue import Queue
from tests.api.conftest import Api
from tests.api.helpers import assert_problem, confirmed


def fail_all(api: Api, codes: list[ErrorCode], worker: str = "w-7") -> None:
    """Play a worker that claims every queued card and fails it with the next code."""
    async def run() -> None:
        pool = await open_pool(api.db_url, min_size=1, max_size=2)
        try:
            # No backoff, so that every code is an attempt of its own.
            queue = Queue(Database(pool), lease_seconds=30, max_attempts=3,
                          retry_base_seconds=0, retry_cap_seconds=0, worker=worker)
            for code in codes:
                for lease in await queue.claim(10):
                    await queue.fail(lease, code)
        finally:
            await pool.close()

    asyncio.run(run())


def pages(c: httpx.Client, path: str, limit: int, **query: str
          ) -> list[list[dict[str, Any]]]:
    out, cursor = [], None
    while True:
        params: dict[str, Any] = {**query, "limit": limit,
                                  **({"cursor": cursor} if cursor else {})}
        r = c.get(path, params=params)
        assert r.status_code == 200, r.text
        out.append(r.json()["items"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out


def test_history_route_pages_in_order_for_the_owner_and_an_admin(local_api: Api) -> None:
    api = local_api
    alice, root, bob = api.make_key("alice"), api.make_key("root", admin=True), api.make_key("bob")
    with api.client(alice) as c:
        card = confirmed(c)
    fail_all(api, [ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.PROCESSING_TIMEOUT,
                   ErrorCode.PROCESSING_TIMEOUT])
    path = f"/v1/files/{card['id']}/events"
    with api.client(alice) as c:
        got = pages(c, path, 2)
        assert [len(p) for p in got] == [2, 2, 2]
        events = [e for p in got for e in p]
        assert [(e["kind"], e["attempt"], e["error_code"]) for e in events] == [
            ("claimed", 1, None), ("retry_scheduled", 1, "storage_unavailable"),
            ("claimed", 2, None), ("retry_scheduled", 2, "processing_timeout"),
            ("claimed", 3, None), ("exhausted", 3, "processing_timeout")]
        assert [e["at"] for e in events] == sorted(e["at"] for e in events)
        assert all(e["duration_seconds"] is None for e in events[::2])
        assert all(e["duration_seconds"] >= 0 for e in events[1::2])
        # The worker's name is the operator's, not the owner's.
        assert {e["worker"] for e in events} == {None}
        assert_problem(c.get(path, params={"cursor": "nonsense"}), 422)
        assert c.get(f"/v1/files/{card['id']}").json()["status"] == "rejected"
    with api.client(root) as c:
        admin_view = [e for p in pages(c, path, 100) for e in p]
        assert [e["kind"] for e in admin_view] == [e["kind"] for e in events]
        assert {e["worker"] for e in admin_view} == {"w-7"}
    with api.client(bob) as c:
        assert_problem(c.get(path), 404)  # another owner's card is no card
        assert_problem(c.get(f"/v1/files/{uuid.uuid4()}/events"), 404)


def test_pause_and_resume_routes_are_an_admins_and_show_in_the_queue(local_api: Api) -> None:
    api = local_api
    root, alice = api.make_key("root", admin=True), api.make_key("alice")
    with api.client(alice) as c:
        assert_problem(c.post("/v1/queue/pause", json={}), 403)
    with api.client(root) as c:
        assert_problem(c.post("/v1/queue/pause", json={"priority": "urgent"}), 422)
        assert_problem(c.post("/v1/queue/pause", json={"owner": ""}), 422)
        r = c.post("/v1/queue/pause", json={"owner": "alice", "priority": "bulk"})
        assert r.status_code == 200, r.text
        assert r.json()["changed"] is True
        assert r.json()["pause"]["paused_by"] == "api:root"
        again = c.post("/v1/queue/pause", json={"owner": "alice", "priority": "bulk"})
        assert again.json() == {**r.json(), "changed": False}
        assert [(p["owner"], p["priority"], p["paused_by"])
                for p in c.get("/v1/queue").json()["claim_pauses"]] == [
            ("alice", "bulk", "api:root")]
        metrics = c.get("/metrics").text
        assert 'darkroom_queue_claims_paused{owner="alice",priority="bulk"} 1.0' in metrics
        assert_problem(c.post("/v1/queue/resume", json={"all": True, "owner": "x"}), 422)
        assert c.post("/v1/queue/resume", json={"owner": "alice"}).json() == {"resumed": []}
        lifted = c.post("/v1/queue/resume", json={"owner": "alice", "priority": "bulk"})
        assert [p["owner"] for p in lifted.json()["resumed"]] == ["alice"]
        health = c.get("/v1/queue").json()
        assert health["claim_pauses"] == []
        assert [(e["kind"], e["owner"], e["actor"]) for e in health["claim_pause_log"]] == [
            ("resumed", "alice", "api:root"), ("paused", "alice", "api:root")]


def test_rejected_cards_by_code_for_the_owner_and_every_owner_for_an_admin(
        local_api: Api) -> None:
    api = local_api
    root, alice, bob = (api.make_key("root", admin=True), api.make_key("alice"),
                        api.make_key("bob"))
    with api.client(alice) as c:
        a = confirmed(c, filename="a.jpg")
    fail_all(api, [ErrorCode.INVALID_IMAGE])
    with api.client(bob) as c:
        b = confirmed(c, filename="b.jpg")
    fail_all(api, [ErrorCode.IMAGE_TOO_LARGE])
    with api.client(alice) as c:
        r = c.get("/v1/files", params={"status": "rejected", "code": "invalid_image"})
        assert [i["id"] for i in r.json()["items"]] == [a["id"]]
        assert c.get("/v1/files", params={"code": "image_too_large"}).json()["items"] == []
        assert_problem(c.get("/v1/files", params={"status": "rejected",
                                                  "all_owners": "true"}), 403)
        assert_problem(c.get("/v1/files", params={"code": "no_such_code"}), 422)
    with api.client(root) as c:
        assert c.get("/v1/queue").json()["rejected_by_code"] == {
            "image_too_large": 1, "invalid_image": 1}
        every = pages(c, "/v1/files", 1, status="rejected", all_owners="true")
        assert [i["id"] for p in every for i in p] == [b["id"], a["id"]]
        one = c.get("/v1/files", params={"status": "rejected", "all_owners": "true",
                                         "code": "image_too_large"}).json()["items"]
        assert [i["id"] for i in one] == [b["id"]]
        assert_problem(c.get("/v1/files", params={"all_owners": "true"}), 422)
