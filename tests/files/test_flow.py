"""The upload flow (darkroom/files.py) without HTTP: real PostgreSQL, a real store (the
local one and SeaweedFS), each step's outcome and what it left in the database and the
store."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from darkroom.card import Card, Priority, Status
from darkroom.config import Settings
from darkroom.files import (
    AlreadyConfirmed,
    Confirmed,
    Conflict,
    Created,
    DigestMismatch,
    Duplicate,
    Empty,
    Files,
    InvalidKey,
    NewUpload,
    NotFound,
    OverQuota,
    Replayed,
    ReusedKey,
    SizeMismatch,
    Stored,
    Throttled,
    TooLarge,
    VersionNotFound,
)
from darkroom.storage import ObjectStore
from tests.support.services import make_queue

LIMIT = 10_000
PHOTO = b"\xff\xd8\xff" + bytes(range(256)) * 4  # the bytes are never decoded here


def flow(pool: Any, store: ObjectStore, **settings: Any) -> Files:
    return Files(make_queue(pool), store,
                 Settings(max_upload_bytes=LIMIT, sweep_guard_seconds=600, **settings))


def new(data: bytes = PHOTO, *, claim: bool = False, **fields: Any) -> NewUpload:
    return NewUpload(filename="a.jpg", content_type="image/jpeg", size=len(data),
                     sha256=hashlib.sha256(data).hexdigest() if claim else None, **fields)


async def chunks(data: bytes, size: int = 100) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def upload(files: Files, made: Created | Replayed, data: bytes = PHOTO) -> str:
    """As a client does it: through the API, or with the presigned request."""
    if made.upload is None:
        done = await files.store_content(made.card.id, made.card.owner, chunks(data),
                                         len(data))
        assert isinstance(done, Stored)
        return done.version
    target = made.upload
    answer = await asyncio.to_thread(httpx.put, target.url, content=data,
                                     headers=target.headers)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-amz-version-id"]


def versions(store: ObjectStore, card: Card) -> list[str]:
    return [v.version for v in store.list(card.original_key) if v.key == card.original_key]


async def created(files: Files, owner: str = "alice", upload_: NewUpload | None = None,
                  **kw: Any) -> Created:
    made = await files.create(owner, upload_ or new(), **kw)
    assert isinstance(made, Created), made
    return made


async def test_create_upload_confirm_queues_the_card_for_that_version(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    made = await created(files)
    assert made.card.status is Status.PENDING and made.card.priority is Priority.INTERACTIVE
    # The local store takes the bytes through the API; S3 signs a request bound to the size.
    assert (made.upload is None) == store.inline_head
    version = await upload(files, made)
    done = await files.confirm(made.card.id, "alice", version)
    assert isinstance(done, Confirmed)
    assert done.card.status is Status.QUEUED and done.card.original_version == version
    # A repeat (its answer lost) answers the card again and changes nothing.
    again = await files.confirm(made.card.id, "alice", version)
    assert isinstance(again, Confirmed) and again.tidy is None
    assert again.card.status is Status.QUEUED and again.card.original_version == version
    # Another version of a confirmed card is a conflict; another owner finds nothing.
    assert isinstance(await files.confirm(made.card.id, "alice", "other"), Conflict)
    assert isinstance(await files.confirm(made.card.id, "bob", version), NotFound)
    assert isinstance(await files.confirm(uuid.uuid4(), "alice", version), NotFound)


async def test_a_create_past_the_limit_is_refused_before_it_is_throttled(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    asked: list[str] = []

    def throttle() -> int:
        asked.append("asked")
        return 7

    big = NewUpload(filename="a.jpg", content_type="image/jpeg", size=LIMIT + 1)
    assert await files.create("alice", big, throttle=throttle) == TooLarge(LIMIT)
    assert asked == []  # a refused create spends nothing of the key's rate
    assert await files.create("alice", new(), throttle=throttle) == Throttled(7)
    assert asked == ["asked"]
    assert await files.reads.list_files("alice") == []


async def test_quotas_refuse_a_new_card_but_not_a_replay(pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store, owner_quota_files=1)
    first = await created(files, key="k-1")
    assert await files.create("alice", new(), key="k-2") == OverQuota(1, 0)
    assert await files.create("alice", new()) == OverQuota(1, 0)
    replay = await files.create("alice", new(), key="k-1")
    assert isinstance(replay, Replayed) and replay.card.id == first.card.id
    assert isinstance(await files.create("bob", new()), Created)  # a quota is per owner


async def test_a_key_answers_its_card_until_the_request_differs(
        pool: Any, store: ObjectStore) -> None:
    """The create committed but its answer was lost: the same request with the same key
    answers that card (pending: where to upload it; confirmed: as it is), never a second.
    A create that did not commit is simply made by the retry."""
    files = flow(pool, store)
    first = await created(files, key="k")
    replay = await files.create("alice", new(), key="k")
    assert isinstance(replay, Replayed) and replay.card.id == first.card.id
    assert replay.card.status is Status.PENDING and replay.uploaded_version is None
    assert (replay.upload is None) == store.inline_head
    # The priority is a scheduling hint, not part of the request.
    bulk = await files.create("alice", new(priority=Priority.BULK), key="k")
    assert isinstance(bulk, Replayed) and bulk.card.id == first.card.id
    assert await files.create("alice", new(allow_duplicate=True), key="k") == ReusedKey()
    assert await files.create("alice", new(), key="") == InvalidKey()
    assert await files.create("alice", new(), key="k\n") == InvalidKey()
    version = await upload(files, replay)
    assert isinstance(await files.confirm(first.card.id, "alice", version), Confirmed)
    after = await files.create("alice", new(), key="k")
    assert isinstance(after, Replayed) and after.card.status is Status.QUEUED
    assert after.upload is None and after.uploaded_version is None
    # Another owner's key of the same name is another key.
    other = await created(files, "bob", key="k")
    assert other.card.id != first.card.id
    assert [c.id for c in await files.reads.list_files("alice")] == [first.card.id]


async def test_a_replayed_create_names_the_upload_its_client_could_not_confirm(
        pool: Any, store: ObjectStore) -> None:
    """The upload of a card with a claimed digest was stored, and its client cut off
    before confirming: the replay names that version, and confirming it queues the card."""
    files = flow(pool, store)
    first = await created(files, upload_=new(claim=True), key="k")
    version = await upload(files, first)
    replay = await files.create("alice", new(claim=True), key="k")
    assert isinstance(replay, Replayed) and replay.uploaded_version == version
    done = await files.confirm(first.card.id, "alice", version)
    assert isinstance(done, Confirmed) and done.card.status is Status.QUEUED


async def test_known_bytes_answer_the_owners_card_unless_a_duplicate_is_allowed(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    first = await created(files, upload_=new(claim=True))
    # Only a verified digest is known: before confirm the claim is trusted for nothing.
    assert isinstance(await files.create("alice", new(claim=True)), Created)
    version = await upload(files, first)
    assert isinstance(await files.confirm(first.card.id, "alice", version), Confirmed)
    card = await files.reads.get_file(first.card.id, "alice")
    assert card is not None
    assert await files.create("alice", new(claim=True)) == Duplicate(card)
    assert isinstance(await files.create("alice", new(claim=True, allow_duplicate=True)),
                      Created)
    assert isinstance(await files.create("bob", new(claim=True)), Created)


async def test_bytes_without_the_claimed_digest_are_refused_and_deleted(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    made = await created(files, upload_=new(claim=True))
    wrong = PHOTO[:-1] + b"\x00"  # the declared size, other bytes
    bad = await upload(files, made, wrong)
    assert await files.confirm(made.card.id, "alice", bad) == DigestMismatch()
    assert bad not in versions(store, made.card)
    card = await files.reads.get_file(made.card.id, "alice")
    assert card is not None and card.status is Status.PENDING
    # The refused version is gone: confirming it again finds nothing to confirm.
    assert await files.confirm(made.card.id, "alice", bad) == VersionNotFound()
    good = await upload(files, made)
    done = await files.confirm(made.card.id, "alice", good)
    assert isinstance(done, Confirmed) and done.card.status is Status.QUEUED


async def test_a_stored_version_of_the_wrong_size_is_refused_and_deleted(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    made = await created(files)
    short = await asyncio.to_thread(store.put, made.card.original_key, PHOTO[:10],
                                    content_type="image/jpeg")
    assert await files.confirm(made.card.id, "alice", short) == SizeMismatch()
    huge = await asyncio.to_thread(store.put, made.card.original_key, b"x" * (LIMIT + 1),
                                   content_type="image/jpeg")
    assert await files.confirm(made.card.id, "alice", huge) == TooLarge(LIMIT)
    assert versions(store, made.card) == []
    assert await files.confirm(made.card.id, "alice", "no-such-version") == VersionNotFound()
    card = await files.reads.get_file(made.card.id, "alice")
    assert card is not None and card.status is Status.PENDING


async def test_confirm_leaves_only_the_confirmed_version(pool: Any, store: ObjectStore) -> None:
    """A presigned URL used twice leaves two versions: the one confirmed stays, the other
    goes once the answer is out (the local store keeps only the newest upload anyway)."""
    files = flow(pool, store)
    made = await created(files)
    first = await upload(files, made)
    second = await upload(files, made)
    done = await files.confirm(made.card.id, "alice", second)
    assert isinstance(done, Confirmed)
    if store.inline_head:
        assert done.tidy is None and versions(store, made.card) == [second]
        return
    assert done.tidy is not None and versions(store, made.card) == [second, first]
    await asyncio.to_thread(done.tidy)
    assert versions(store, made.card) == [second]


async def test_an_upload_through_the_api_keeps_only_the_newest(
        pool: Any, store: ObjectStore) -> None:
    files = flow(pool, store)
    made = await created(files)
    card = made.card
    first = await files.store_content(card.id, "alice", chunks(PHOTO))
    second = await files.store_content(card.id, "alice", chunks(PHOTO))
    assert isinstance(first, Stored) and isinstance(second, Stored)
    assert versions(store, card) == [second.version]
    assert await files.store_content(card.id, "alice", chunks(b"")) == Empty()
    assert await files.store_content(card.id, "alice", chunks(PHOTO[:-1])) == SizeMismatch()
    # Past the limit: refused on the announced length before a byte is read, or as soon
    # as the count passes it, whatever was announced.
    assert await files.store_content(card.id, "alice", chunks(b"x"),
                                     declared=LIMIT + 1) == TooLarge(LIMIT)
    assert await files.store_content(card.id, "alice", chunks(b"x" * (LIMIT + 1)),
                                     declared=10) == TooLarge(LIMIT)
    assert versions(store, card) == [second.version]
    assert await files.store_content(card.id, "bob", chunks(PHOTO)) == NotFound()
    assert isinstance(await files.confirm(card.id, "alice", second.version), Confirmed)
    assert await files.store_content(card.id, "alice", chunks(PHOTO)) == AlreadyConfirmed()
