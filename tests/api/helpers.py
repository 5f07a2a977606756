"""Client-side steps of the upload protocol, as a real client takes them."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid
from typing import Any

import httpx
from PIL import Image

from darkroom.config import Settings
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.queue import Derived, DerivedObject, Queue, derived_key, thumb_key
from darkroom.storage import ObjectStore

JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 200


def create(
    client: httpx.Client,
    *,
    size: int = len(JPEG),
    filename: str = "a.jpg",
    content_type: str = "image/jpeg",
) -> httpx.Response:
    return client.post(
        "/v1/files", json={"filename": filename, "content_type": content_type, "size": size}
    )


def put_original(client: httpx.Client, upload: dict[str, Any], body: bytes) -> str:
    """PUT the bytes where the API said; answers the version id the store gave them."""
    if upload["url"].startswith(("/", str(client.base_url))):
        # The API's own content route (relative unless DARKROOM_PUBLIC_URL is set):
        # authenticated like every API call.
        r = client.request(upload["method"], upload["url"], content=body, headers=upload["headers"])
        assert r.status_code == 200, r.text
        return str(r.json()["version"])
    r = httpx.request(upload["method"], upload["url"], content=body, headers=upload["headers"])
    assert r.status_code == 200, r.text
    return r.headers["x-amz-version-id"]


def upload(client: httpx.Client, body: bytes = JPEG, **kwargs: Any) -> tuple[dict[str, Any], str]:
    r = create(client, size=len(body), **kwargs)
    assert r.status_code == 201, r.text
    card = r.json()
    return card, put_original(client, card["upload"], body)


def confirmed(client: httpx.Client, body: bytes = JPEG, **kwargs: Any) -> dict[str, Any]:
    card, version = upload(client, body, **kwargs)
    r = client.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
    assert r.status_code == 202, r.text
    return dict(r.json())


def make_ready(
    db_url: str, settings: Settings, store: ObjectStore, file_id: str, webp: bytes,
    thumb: bytes | None = None,
) -> None:
    """Play the worker through the lease protocol itself (there is no worker here)."""

    async def run() -> None:
        pool = await open_pool(db_url, min_size=1, max_size=2)
        try:
            queue = Queue.from_settings(Database(pool), settings, worker="test")
            leases = await queue.claim(10)
            lease = next(le for le in leases if le.file_id == uuid.UUID(file_id))
            key = derived_key(lease)
            version = store.put(key, webp, content_type="image/webp")
            small = None
            if thumb is not None:
                small_key = thumb_key(lease)
                small = DerivedObject(
                    key=small_key, version=store.put(small_key, thumb, content_type="image/webp"),
                    sha256=hashlib.sha256(thumb).hexdigest(), width=1, height=1,
                    size=len(thumb))
            await queue.complete(
                lease,
                Derived(
                    key=key,
                    version=version,
                    sha256=hashlib.sha256(webp).hexdigest(),
                    width=3,
                    height=2,
                    size=len(webp),
                    thumb=small,
                    thumbhash="AAAA" if small else None,
                ),
            )
            rest = [le for le in leases if le.file_id != lease.file_id]
            await queue.release(rest)
        finally:
            await pool.close()

    asyncio.run(run())


PROBLEM = "application/problem+json"


def assert_problem(r: httpx.Response, status: int, slug: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert body["type"].startswith("https://darkroom.dev/problems/")
    if slug:
        assert body["type"].endswith("/" + slug)
    # Never a path, a URL, SQL or a traceback in an error.
    text = r.text
    for leak in (
        "/tmp",
        "file://",
        "s3://",
        "http://",
        "Traceback",
        "SELECT",
        "psycopg",
        "archive_files",
    ):
        assert leak not in text, (leak, text)
    return dict(body)


def image_bytes(fmt: str, size: tuple[int, int] = (40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 120, 40)).save(out, format=fmt)
    return out.getvalue()
