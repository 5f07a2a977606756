"""The HTTP contract of DESIGN §4 over real HTTP, on the local store and on S3."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from typing import Any

import httpx

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.layout import original_key
from darkroom.queue import Queue
from tests.api.conftest import MAX_UPLOAD, Api
from tests.api.helpers import (
    JPEG,
    assert_problem,
    confirmed,
    create,
    make_ready,
    put_original,
    upload,
)
from tests.support.sql import SQL

WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L" + b"\x01" * 14



# --- the happy path ----------------------------------------------------------------------



def stored_key(card: dict[str, Any], owner: str = "alice") -> str:
    """Where a card of `owner` made by the API has its original."""
    return original_key(uuid.UUID(card["id"]), owner)

def test_upload_confirm_get_list(api: Api) -> None:
    with api.client(api.make_key()) as c:
        r = create(c)
        assert r.status_code == 201
        card = r.json()
        assert card["status"] == "pending"
        assert r.headers["location"] == f"/v1/files/{card['id']}"
        assert card["derivative"] is None and card["attempts"] == 0
        assert card["upload"]["method"] == "PUT"
        if api.kind == "s3":
            assert "X-Amz-Signature" in card["upload"]["url"]
        else:
            # Relative: DARKROOM_PUBLIC_URL is not set, and Host is never used.
            assert card["upload"]["url"] == f"/v1/files/{card['id']}/content"
        version = put_original(c, card["upload"], JPEG)
        assert api.store.head(stored_key(card), version).size == len(JPEG)

        r = c.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/v1/files/{card['id']}"
        assert r.json()["status"] == "queued"

        got = c.get(f"/v1/files/{card['id']}").json()
        assert got["status"] == "queued"
        assert set(got) >= {
            "id",
            "status",
            "error_code",
            "attempts",
            "created_at",
            "updated_at",
            "derivative",
        }
        listing = c.get("/v1/files").json()
        assert [i["id"] for i in listing["items"]] == [card["id"]]
        assert listing["next_cursor"] is None


def test_confirm_is_idempotent_and_fenced(api: Api) -> None:
    with api.client(api.make_key()) as c:
        card, v1 = upload(c)
        # A second upload of the same size: the card keeps only this latest one.
        v2 = put_original(c, card["upload"], JPEG[:-1] + b"x")
        url = f"/v1/files/{card['id']}/confirm"
        first = c.post(url, json={"version": v2})
        again = c.post(url, json={"version": v2})
        assert first.status_code == again.status_code == 202
        assert again.json()["status"] == "queued"
        assert again.json()["updated_at"] == first.json()["updated_at"]  # nothing changed
        assert_problem(c.post(url, json={"version": v1}), 409, "conflict")
        # The content route is closed once confirmed.
        assert_problem(c.put(f"/v1/files/{card['id']}/content", content=JPEG), 409)

        make_ready(api.db_url, api.settings, api.store, card["id"], WEBP)
        assert c.post(url, json={"version": v2}).status_code == 202
        assert_problem(c.post(url, json={"version": v1}), 409, "conflict")


def test_confirm_unknown_version_is_422(api: Api) -> None:
    with api.client(api.make_key()) as c:
        card, version = upload(c)
        for bogus in ("0000000000000000-deadbeef", "no-such-version", version + "x"):
            body = assert_problem(
                c.post(f"/v1/files/{card['id']}/confirm", json={"version": bogus}),
                422,
                "version_not_found",
            )
            assert body["errors"][0]["field"] == "version"
        assert c.get(f"/v1/files/{card['id']}").json()["status"] == "pending"


def test_declared_size_over_the_limit_is_413_at_once(api: Api) -> None:
    with api.client(api.make_key()) as c:
        body = assert_problem(create(c, size=MAX_UPLOAD + 1), 413, "payload_too_large")
        assert body["limit"] == MAX_UPLOAD
        assert c.get("/v1/files").json()["items"] == []  # no card was made
        assert create(c, size=MAX_UPLOAD).status_code == 201


def test_streamed_upload_over_the_limit_is_413(api: Api) -> None:
    with api.client(api.make_key()) as c:
        card = create(c, size=MAX_UPLOAD).json()
        content = f"/v1/files/{card['id']}/content"
        big = b"\xff" * (MAX_UPLOAD + 1)

        def chunks() -> Any:
            # No Content-Length: the server must count as the bytes arrive.
            for i in range(0, len(big), 16_384):
                yield big[i : i + 16_384]

        assert_problem(c.put(content, content=chunks()), 413, "payload_too_large")
        assert_problem(c.put(content, content=big), 413, "payload_too_large")
        assert list(api.store.list(stored_key(card))) == []
        # Exactly at the limit is fine.
        assert c.put(content, content=big[:MAX_UPLOAD]).status_code == 200


def test_a_card_made_before_owners_were_in_the_key_uploads_and_confirms(api: Api) -> None:
    """A pending card whose original key is the old form (made before the upgrade) keeps
    it: its upload instructions name that key, and confirm finds the bytes there."""
    import psycopg

    body = {"filename": "a.jpg", "content_type": "image/jpeg", "size": len(JPEG)}
    with api.client(api.make_key()) as c:
        card = c.post("/v1/files", json=body, headers={"Idempotency-Key": "old-1"}).json()
        file_id = uuid.UUID(card["id"])
        old_key = original_key(file_id, None)
        assert stored_key(card) != old_key
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            conn.execute(SQL["set_original_key"], {"key": old_key, "id": file_id})
        replay = c.post("/v1/files", json=body, headers={"Idempotency-Key": "old-1"})
        assert replay.status_code == 201, replay.text
        version = put_original(c, replay.json()["upload"], JPEG)
        assert api.store.head(old_key, version).size == len(JPEG)
        assert list(api.store.list(stored_key(card))) == []
        r = c.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "queued"
        with psycopg.connect(api.db_url) as conn:
            row = conn.execute(SQL["original_of"], {"id": file_id}).fetchone()
        assert row == (old_key, version)


def test_confirm_checks_the_stored_size(api: Api) -> None:
    with api.client(api.make_key()) as c:
        card = create(c, size=10).json()
        # Bytes that reached the store some other way than through our limit.
        version = api.store.put(
            stored_key(card), b"\0" * (MAX_UPLOAD + 1), content_type="image/jpeg"
        )
        assert_problem(
            c.post(f"/v1/files/{card['id']}/confirm", json={"version": version}),
            413,
            "payload_too_large",
        )


def test_derivative(api: Api) -> None:
    with api.client(api.make_key()) as c:
        card = confirmed(c)
        assert_problem(c.get(f"/v1/files/{card['id']}/derivative"), 409, "not_ready")
        make_ready(api.db_url, api.settings, api.store, card["id"], WEBP)
        got = c.get(f"/v1/files/{card['id']}").json()
        sha = hashlib.sha256(WEBP).hexdigest()
        assert got["status"] == "ready"
        assert got["derivative"] == {
            "url": f"/v1/files/{card['id']}/derivative",
            "width": 3,
            "height": 2,
            "bytes": len(WEBP),
            "sha256": sha,
        }
        r = c.get(got["derivative"]["url"])
        if api.kind == "s3":
            assert r.status_code == 307
            assert r.headers["cache-control"] == "no-store"
            fetched = httpx.get(r.headers["location"])
            assert fetched.status_code == 200 and fetched.content == WEBP
        else:
            assert r.status_code == 200 and r.content == WEBP
            assert r.headers["content-type"] == "image/webp"
            assert r.headers["etag"] == f'"{sha}"'
            assert "private" in r.headers["cache-control"]
            again = c.get(got["derivative"]["url"], headers={"If-None-Match": f'"{sha}"'})
            assert again.status_code == 304 and again.content == b""


def test_thumb_derivative(api: Api) -> None:
    thumb = WEBP + b"thumb"
    with api.client(api.make_key()) as c:
        card = confirmed(c)
        old = confirmed(c)
        make_ready(api.db_url, api.settings, api.store, card["id"], WEBP, thumb=thumb)
        got = c.get(f"/v1/files/{card['id']}").json()
        assert got["derivatives"]["preview"] == got["derivative"]
        assert got["derivatives"]["thumb"] == {
            "url": f"/v1/files/{card['id']}/derivative?size=thumb",
            "width": 1,
            "height": 1,
            "bytes": len(thumb),
            "sha256": hashlib.sha256(thumb).hexdigest(),
        }
        assert got["thumbhash"] == "AAAA"
        r = c.get(got["derivatives"]["thumb"]["url"])
        body = httpx.get(r.headers["location"]).content if r.status_code == 307 else r.content
        assert body == thumb
        assert_problem(c.get(f"/v1/files/{card['id']}/derivative?size=huge"), 422,
                       "validation_error")
        # A card derived before thumbs existed: its thumb is its preview.
        make_ready(api.db_url, api.settings, api.store, old["id"], WEBP)
        legacy = c.get(f"/v1/files/{old['id']}").json()
        assert legacy["derivatives"]["thumb"] == legacy["derivative"]
        assert legacy["thumbhash"] is None


def test_delete(api: Api) -> None:
    with api.client(api.make_key()) as c:
        keep = confirmed(c)
        gone = confirmed(c)
        r = c.delete(f"/v1/files/{gone['id']}")
        assert r.status_code == 202
        assert_problem(c.get(f"/v1/files/{gone['id']}"), 404, "not_found")
        assert_problem(c.delete(f"/v1/files/{gone['id']}"), 404, "not_found")
        assert [i["id"] for i in c.get("/v1/files").json()["items"]] == [keep["id"]]


# --- what does not depend on the store ---------------------------------------------------


def test_owner_isolation_on_every_route(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key("alice")) as alice, api.client(api.make_key("bob")) as bob:
        pending, pending_version = upload(alice)
        ready = confirmed(alice)
        make_ready(api.db_url, api.settings, api.store, ready["id"], WEBP)
        missing = str(uuid.uuid4())

        def calls(file_id: str, version: str) -> list[httpx.Response]:
            return [
                bob.get(f"/v1/files/{file_id}"),
                bob.put(f"/v1/files/{file_id}/content", content=JPEG),
                bob.post(f"/v1/files/{file_id}/confirm", json={"version": version}),
                bob.get(f"/v1/files/{file_id}/derivative"),
                bob.post(f"/v1/files/{file_id}/retry"),
                bob.get(f"/v1/files/{file_id}/events"),
                bob.delete(f"/v1/files/{file_id}"),
            ]

        theirs = calls(pending["id"], pending_version) + calls(ready["id"], "v")
        nobodys = calls(missing, pending_version) + calls(missing, "v")
        malformed = calls("not-a-uuid", "v")
        for answer in theirs + nobodys + malformed:
            assert_problem(answer, 404, "not_found")
        bodies = {a.content for a in theirs + nobodys + malformed}
        assert len(bodies) == 1  # byte for byte the same answer
        headers = {
            tuple(sorted((k, v) for k, v in a.headers.items() if k != "date"))
            for a in theirs + nobodys
        }
        assert len(headers) == 1
        assert bob.get("/v1/files").json()["items"] == []
        # And alice still has both, untouched.
        assert alice.get(f"/v1/files/{pending['id']}").json()["status"] == "pending"
        assert alice.get(f"/v1/files/{ready['id']}").json()["status"] == "ready"


def test_no_key_or_bad_key_is_401(local_api: Api) -> None:
    api = local_api
    file_id = str(uuid.uuid4())
    requests = [
        ("POST", "/v1/files"),
        ("GET", "/v1/files"),
        ("GET", f"/v1/files/{file_id}"),
        ("PUT", f"/v1/files/{file_id}/content"),
        ("POST", f"/v1/files/{file_id}/confirm"),
        ("GET", f"/v1/files/{file_id}/derivative"),
        ("DELETE", f"/v1/files/{file_id}"),
        ("GET", "/v1/queue"),
        ("GET", f"/v1/files/{file_id}/events"),
        ("POST", "/v1/queue/pause"),
        ("POST", "/v1/queue/resume"),
    ]
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer dk_nope"},
        {"Authorization": "Bearer x"},
        {"Authorization": "Basic YTpi"},
        {"Authorization": "Bearer"},
    ]
    with httpx.Client(base_url=api.url) as c:
        for method, path in requests:
            for headers in bad_headers:
                r = c.request(method, path, headers=headers, json={})
                assert_problem(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")


def test_queue_needs_an_admin_key(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key("alice")) as user:
        assert_problem(user.get("/v1/queue"), 403, "forbidden")
        confirmed(user)
    with api.client(api.make_key("root", admin=True)) as admin:
        r = admin.get("/v1/queue")
        assert r.status_code == 200
        stats = r.json()
        assert stats["counts"]["queued"] == 1
        assert set(stats) >= {
            "counts",
            "oldest_claimable_age_seconds",
            "expired_leases",
            "rejected_share_1h",
            "rejected_share_24h",
            "completed_last_minute",
            "lease_lost_total",
        }


def test_cursor_pagination(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key()) as c:
        made = [create(c, filename=f"{i}.jpg").json()["id"] for i in range(7)]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/v1/files", params=params).json()
            seen += [i["id"] for i in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert seen == list(reversed(made))  # newest first, each once
        c.post(f"/v1/files/{made[0]}/confirm", json={"version": "x"})  # still pending
        assert [
            i["id"]
            for i in c.get("/v1/files", params={"status": "pending", "limit": 200}).json()["items"]
        ] == list(reversed(made))
        assert c.get("/v1/files", params={"status": "ready"}).json()["items"] == []
        for bad in (
            {"cursor": "garbage"},
            {"cursor": "W10"},
            {"limit": 0},
            {"limit": 201},
            {"limit": "x"},
            {"status": "deleting"},
        ):
            body = assert_problem(c.get("/v1/files", params=bad), 422, "validation_error")
            assert body["errors"][0]["field"] in bad


def test_validation_errors_name_the_field(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key()) as c:
        cases: list[tuple[Any, str]] = [
            ({"filename": "a.jpg", "content_type": "image/jpeg"}, "size"),
            ({"filename": "a.jpg", "content_type": "image/jpeg", "size": "12"}, "size"),
            ({"filename": "a.jpg", "content_type": "image/jpeg", "size": 0}, "size"),
            ({"filename": "", "content_type": "image/jpeg", "size": 1}, "filename"),
            ({"filename": "a\0.jpg", "content_type": "image/jpeg", "size": 1}, "filename"),
            ({"filename": "a.txt", "content_type": "text/plain", "size": 1}, "content_type"),
            ({"filename": "a.bmp", "content_type": "image/bmp", "size": 1}, "content_type"),
        ]
        for payload, field in cases:
            body = assert_problem(c.post("/v1/files", json=payload), 422, "validation_error")
            assert [e["field"] for e in body["errors"]] == [field], body
            assert all(e["message"] for e in body["errors"])
        body = assert_problem(
            c.post("/v1/files", content=b"{not json", headers={"Content-Type": "application/json"}),
            422,
        )
        assert body["errors"]
        card = create(c).json()
        body = assert_problem(c.post(f"/v1/files/{card['id']}/confirm", json={}), 422)
        assert body["errors"][0]["field"] == "version"
        body = assert_problem(c.put(f"/v1/files/{card['id']}/content", content=b""), 422)
        assert body["errors"][0]["field"] == "body"


def test_unknown_routes_and_methods_are_problems(local_api: Api) -> None:
    with local_api.client(local_api.make_key()) as c:
        assert_problem(c.get("/v2/nothing"), 404, "not_found")
        assert_problem(c.patch("/v1/files"), 405, "method_not_allowed")


def test_priority_and_the_derivative_during_a_rederive(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key()) as c:
        assert create(c).json()["priority"] == "interactive"
        r = c.post("/v1/files", json={"filename": "a.jpg", "content_type": "image/jpeg",
                                      "size": 10, "priority": "bulk"})
        assert r.status_code == 201 and r.json()["priority"] == "bulk"
        bad = c.post("/v1/files", json={"filename": "a.jpg", "content_type": "image/jpeg",
                                        "size": 10, "priority": "urgent"})
        assert_problem(bad, 422, "validation_error")
        card = confirmed(c)
        make_ready(api.db_url, api.settings, api.store, card["id"], WEBP)

        async def rederive() -> int:
            pool = await open_pool(api.db_url, min_size=1, max_size=1)
            try:
                return await Queue(Database(pool), lease_seconds=30, max_attempts=3,
                                   retry_base_seconds=0, retry_cap_seconds=0
                                   ).rederive("alice", "new settings")
            finally:
                await pool.close()

        assert asyncio.run(rederive()) == 1
        got = c.get(f"/v1/files/{card['id']}").json()
        # Queued again, as bulk work, and still serving the derivative it has.
        assert got["status"] == "queued" and got["priority"] == "bulk"
        assert got["derivative"]["sha256"] == hashlib.sha256(WEBP).hexdigest()
        r = c.get(got["derivative"]["url"])
        assert r.status_code == 200 and r.content == WEBP
        assert r.headers["cache-control"] == "private, no-cache"
        root = api.make_key("root", admin=True)
        with api.client(root) as admin:
            q = admin.get("/v1/queue").json()
        assert q["rederive_pending"] == 1
        assert q["backlog"]["by_priority"]["bulk"]["waiting"] == 1
        assert q["backlog"]["top_owners"][0]["owner"] == "alice"
        text = httpx.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {root}"}).text
        assert 'darkroom_queue_waiting{priority="bulk"} 1.0' in text
        assert 'darkroom_queue_top_owner_waiting{owner="alice"} 1.0' in text
        assert "darkroom_queue_rederive_pending 1.0" in text


def test_metrics(local_api: Api) -> None:
    api = local_api
    with api.client(api.make_key()) as c:
        confirmed(c)
        c.get(f"/v1/files/{uuid.uuid4()}")
        text = httpx.get(f"{api.url}/metrics",
                         headers={"Authorization": f"Bearer {api.make_key('ops', True)}"}).text
    assert 'darkroom_queue_files{status="queued"} 1.0' in text
    for gauge in (
        "darkroom_queue_stats_up 1.0",
        "darkroom_queue_oldest_claimable_age_seconds",
        "darkroom_queue_expired_leases",
        'darkroom_queue_rejected_share{window="1h"}',
        "darkroom_queue_completed_last_minute",
        "darkroom_queue_lease_lost_events",
    ):
        assert gauge in text
    assert re.search(
        r'darkroom_http_requests_total\{method="GET",'
        r'route="/v1/files/\{file_id\}",status="404"\} 1\.0',
        text,
    )
    assert (
        'darkroom_http_request_duration_seconds_bucket{le="0.005",method="POST",'
        'route="/v1/files/{file_id}/confirm"}' in text
    )
    # Route templates only: no raw id ever becomes a label.
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", text)


def test_health_and_readiness(local_api: Api) -> None:
    api = local_api
    assert httpx.get(f"{api.url}/healthz").json() == {"status": "ok", "checks": {}}
    r = httpx.get(f"{api.url}/readyz")
    assert r.status_code == 200
    assert r.json()["checks"] == {"database": "ok", "storage": "ok"}


def test_openapi_and_page_are_served(local_api: Api) -> None:
    api = local_api
    schema = httpx.get(f"{api.url}/openapi.json").json()
    assert {
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/confirm",
        "/v1/queue",
        "/readyz",
    } <= set(schema["paths"])
    assert "Problem" in schema["components"]["schemas"]
    # Swagger UI comes from a CDN: off unless DARKROOM_API_DOCS is set.
    assert httpx.get(f"{api.url}/docs").status_code == 404
    page = httpx.get(f"{api.url}/")
    assert page.status_code == 200 and "data-testid" in page.text
    assert httpx.get(f"{api.url}/static/app.js").status_code == 200


def test_problem_json_shape_is_stable(local_api: Api) -> None:
    with local_api.client(local_api.make_key()) as c:
        body = assert_problem(c.get(f"/v1/files/{uuid.uuid4()}"), 404)
        assert body == {
            "type": "https://darkroom.dev/problems/not_found",
            "title": "Not Found",
            "status": 404,
            "detail": "No such file.",
        }
        json.dumps(body)
