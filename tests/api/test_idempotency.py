"""Uploads that are safe to retry: Idempotency-Key, known content, and the
digest checked at confirm. Real API over HTTP, real PostgreSQL, both stores."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.layout import original_key
from darkroom.queue import Queue
from darkroom.sweeper import Sweeper
from tests.api.conftest import Api
from tests.api.helpers import JPEG, put_original
from tests.support.faults import FaultProxy
from tests.support.sql import SQL

OTHER = b"\xff\xd8\xff\xe0" + b"\1" * 300


def body_for(data: bytes, **extra: Any) -> dict[str, Any]:
    return {"filename": "a.jpg", "content_type": "image/jpeg", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), **extra}


def cards(api: Api, owner: str) -> list[dict[str, Any]]:
    with psycopg.connect(api.db_url) as conn:
        cur = conn.execute(SQL["owner_cards"], {"owner": owner})
        return [{"id": r[0], "status": r[1]} for r in cur.fetchall()]


def confirm(client: httpx.Client, card: dict[str, Any], version: str) -> httpx.Response:
    return client.post(f"/v1/files/{card['id']}/confirm", json={"version": version})


def test_same_key_same_body_answers_the_same_card(api: Api) -> None:
    key = api.make_key("alice")
    with api.client(key) as c:
        headers = {"Idempotency-Key": "photo-1"}
        first = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert first.status_code == 201, first.text
        again = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["upload"]["method"] == "PUT"  # still pending: upload again
        assert again.json()["uploaded_version"] is None  # nothing stored yet

        version = put_original(c, first.json()["upload"], JPEG)
        # Cut off before the confirm: the repeat names the stored upload to confirm.
        resumed = c.post("/v1/files", json=body_for(JPEG), headers=headers).json()
        assert resumed["uploaded_version"] == version
        assert confirm(c, resumed, version).status_code == 202

        done = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert done.status_code == 200
        assert done.json()["id"] == first.json()["id"]
        assert done.json()["status"] == "queued" and "upload" not in done.json()
    assert len(cards(api, "alice")) == 1


def test_same_key_other_body_is_422_and_keys_are_per_owner(local_api: Api) -> None:
    api = local_api
    alice, bob = api.make_key("alice"), api.make_key("bob")
    headers = {"Idempotency-Key": "k"}
    with api.client(alice) as a, api.client(bob) as b:
        assert a.post("/v1/files", json=body_for(JPEG), headers=headers).status_code == 201
        r = a.post("/v1/files", json=body_for(OTHER), headers=headers)
        assert r.status_code == 422
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("/idempotency_key_reused")
        # Without a digest too: the fingerprint is the whole validated body.
        r = a.post("/v1/files", json={"filename": "b.jpg", "content_type": "image/jpeg",
                                      "size": 9}, headers=headers)
        assert r.status_code == 422
        # A scheduling hint is not part of the request: the same create, replayed.
        r = a.post("/v1/files", json=body_for(JPEG, priority="bulk"), headers=headers)
        assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true"
        # The same key is another owner's own.
        r = b.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert r.status_code == 201 and "idempotent-replayed" not in r.headers
        bad = a.post("/v1/files", json=body_for(JPEG), headers={"Idempotency-Key": "x" * 256})
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["field"] == "Idempotency-Key"
    assert len(cards(api, "alice")) == 1 and len(cards(api, "bob")) == 1


def test_create_retried_after_a_cut_connection_makes_one_card(api: Api) -> None:
    """The server made the card and answered; the proxy reset the connection instead of
    passing the answer on. The client retries with the same key: one card."""
    key = api.make_key("alice")
    port = int(api.url.rsplit(":", 1)[1])
    with FaultProxy(("127.0.0.1", port)) as proxy, httpx.Client(
        base_url=f"http://{proxy.url_host()}", headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as c:
        proxy.cut_answers(1)
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        with pytest.raises(httpx.TransportError):
            c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert proxy.counters.cut_after == 1
        made = cards(api, "alice")
        assert len(made) == 1  # the server acted on the lost request

        retry = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert retry.status_code == 201
        assert retry.headers["idempotent-replayed"] == "true"
        assert retry.json()["id"] == str(made[0]["id"])
        version = put_original(c, retry.json()["upload"], JPEG)
        # The confirm's answer is lost too; confirming again is idempotent.
        proxy.cut_answers(1)
        with pytest.raises(httpx.TransportError):
            confirm(c, retry.json(), version)
        assert confirm(c, retry.json(), version).status_code == 202
    assert [card["status"] for card in cards(api, "alice")] == ["queued"]


def test_known_content_answers_the_existing_card_unless_a_duplicate_is_allowed(
    api: Api,
) -> None:
    key = api.make_key("alice")
    with api.client(key) as c:
        # An unconfirmed card with the digest is not "known": its bytes were never checked.
        first = c.post("/v1/files", json=body_for(JPEG)).json()
        assert c.post("/v1/files", json=body_for(JPEG)).status_code == 201
        version = put_original(c, first["upload"], JPEG)
        assert confirm(c, first, version).status_code == 202

        known = c.post("/v1/files", json=body_for(JPEG, filename="again.jpg"),
                       headers={"Idempotency-Key": "other"})
        assert known.status_code == 200, known.text
        assert known.json()["duplicate_of"] == first["id"] == known.json()["id"]
        assert "upload" not in known.json()

        copy = c.post("/v1/files", json=body_for(JPEG, allow_duplicate=True))
        assert copy.status_code == 201 and copy.json()["id"] != first["id"]
        # Another owner's archive is not looked at.
    with api.client(api.make_key("bob")) as b:
        assert b.post("/v1/files", json=body_for(JPEG)).status_code == 201
        # A deleted card is not live: the bytes are new again.
    with api.client(key) as c:
        assert c.delete(f"/v1/files/{first['id']}").status_code == 202
        assert c.post("/v1/files", json=body_for(JPEG)).status_code == 201


def test_a_lying_digest_is_refused_at_confirm(api: Api) -> None:
    key = api.make_key("alice")
    with api.client(key) as c:
        claimed = body_for(OTHER)
        claimed["size"] = len(JPEG)
        card = c.post("/v1/files", json=claimed).json()
        version = put_original(c, card["upload"], JPEG)
        r = confirm(c, card, version)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("/digest_mismatch")
        assert c.get(f"/v1/files/{card['id']}").json()["status"] == "pending"
        # The refused bytes are gone, and the lie made nothing "known".
        assert not [o for o in api.store.list(original_key(uuid.UUID(card["id"]), "alice"))]
        assert c.post("/v1/files", json=body_for(OTHER)).status_code == 201
        # The right bytes for the claim are taken.
        right = c.post("/v1/files", json=body_for(OTHER)).json()
        good = put_original(c, right["upload"], OTHER)
        assert confirm(c, right, good).status_code == 202
        assert confirm(c, right, good).status_code == 202  # a repeat: not hashed again


def test_a_deleted_card_frees_its_key_and_old_keys_are_swept(local_api: Api) -> None:
    api = local_api
    key = api.make_key("alice")
    headers = {"Idempotency-Key": "k1"}
    with api.client(key) as c:
        first = c.post("/v1/files", json=body_for(JPEG), headers=headers).json()
        assert c.delete(f"/v1/files/{first['id']}").status_code == 202
        second = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert second.status_code == 201 and second.json()["id"] != first["id"]
        assert "idempotent-replayed" not in second.headers

        c.post("/v1/files", json=body_for(JPEG), headers={"Idempotency-Key": "k2"})
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            conn.execute(SQL["age_idempotency_key"], {"id": second.json()["id"]})

        async def sweep() -> int:
            pool = await open_pool(api.db_url, min_size=1, max_size=1)
            try:
                sweeper = Sweeper(Queue.from_settings(Database(pool), api.settings), api.store,
                                  guard_seconds=300, retention_seconds=86_400)
                return (await sweeper.sweep_once()).keys_pruned
            finally:
                await pool.close()

        assert asyncio.run(sweep()) == 1
        with psycopg.connect(api.db_url) as conn:
            (left,) = conn.execute(SQL["idempotency_key_count"]).fetchone() or (0,)
        assert left == 1
        # Past its retention the key is new again.
        third = c.post("/v1/files", json=body_for(JPEG), headers=headers)
        assert third.status_code == 201 and third.json()["id"] != second.json()["id"]


def test_concurrent_creates_with_one_key_make_one_card(local_api: Api) -> None:
    api = local_api
    key = api.make_key("alice")
    headers = {"Idempotency-Key": "burst"}

    def create(_: int) -> str:
        with api.client(key) as c:
            r = c.post("/v1/files", json=body_for(JPEG), headers=headers)
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = set(pool.map(create, range(16)))
    assert len(ids) == 1
    assert [str(c["id"]) for c in cards(api, "alice")] == list(ids)
