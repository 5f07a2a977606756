"""A real archive for the page's tests and bench/page.py: thousands of cards of one owner,
made through the lease protocol, with real derivatives of the corpus photos."""

from __future__ import annotations

import asyncio
import uuid

from darkroom.config import load_settings
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.derive import Limits, derive
from darkroom.errors import ErrorCode
from darkroom.queue import Derived, DerivedObject, Lease, Queue
from darkroom.storage import ObjectStore
from tests.support.services import CORPUS, confirm

CARDS = 2000
REJECTED_EVERY = 9  # every ninth card is rejected, with its error shown
LONG_NAME = "IMG_" + "2026-12-03_an_unbroken_file_name_that_never_ends_" * 4 + ".heic"


def _photos(store: ObjectStore) -> list[Derived]:
    """The corpus photos' real derivatives, stored once and shared by every card."""
    out = []
    for path in sorted(CORPUS.glob("*.jpg")):
        result = derive(path.read_bytes(), Limits.from_settings(load_settings()))
        assert result.thumb is not None
        key, small = f"derived/shared/{path.stem}.webp", f"derived/shared/{path.stem}.t.webp"
        thumb = DerivedObject(
            key=small, version=store.put(small, result.thumb.data, content_type="image/webp"),
            sha256=result.thumb.sha256, width=result.thumb.width, height=result.thumb.height,
            size=result.thumb.size)
        out.append(Derived(
            key=key, version=store.put(key, result.data, content_type="image/webp"),
            sha256=result.sha256, width=result.width, height=result.height, size=result.size,
            thumb=thumb, thumbhash=result.thumbhash))
    return out


async def fill(db_url: str, store: ObjectStore, owner: str) -> uuid.UUID:
    """CARDS cards of `owner`; answers the newest, left queued."""
    photos = _photos(store)
    pool = await open_pool(db_url, min_size=2, max_size=6)
    try:
        queue = Queue(Database(pool), lease_seconds=600, max_attempts=3, retry_base_seconds=0,
                      retry_cap_seconds=0, worker="seed")

        async def one(i: int) -> uuid.UUID:
            name = LONG_NAME if i % 10 == 3 else f"photo-{i:05d}.jpg"
            card = await queue.create_file(owner=owner, filename=name,
                                           content_type="image/jpeg", size=1000 + i)
            await confirm(queue, card["id"], owner, "v1")
            return uuid.UUID(str(card["id"]))

        ids: list[uuid.UUID] = []
        for start in range(0, CARDS - 1, 50):
            batch = range(start, min(start + 50, CARDS - 1))
            ids += await asyncio.gather(*(one(i) for i in batch))
        ids.append(await one(CARDS - 1))  # alone, so that it is surely the newest
        index = {file_id: n for n, file_id in enumerate(ids)}
        last = ids[-1]
        finished = 0
        while finished < CARDS:
            leases = await queue.claim(100)
            assert leases, "the queue ran dry before every card was claimed"
            done: list[tuple[Lease, Derived]] = []
            for lease in leases:
                n = index[lease.file_id]
                if lease.file_id == last:
                    await queue.release([lease])  # the newest stays queued
                elif n % REJECTED_EVERY == 4:
                    await queue.fail(lease, ErrorCode.INVALID_IMAGE)
                else:
                    done.append((lease, photos[n % len(photos)]))
                finished += lease.file_id != last
            await queue.complete_many(done)
            if finished == CARDS - 1:
                break
        return last
    finally:
        await pool.close()


FIRST_SCREEN_DONE = """() => {
  const near = [...document.querySelectorAll('[data-testid="card"][data-visible="1"]')]
    .filter((c) => c.dataset.status === "ready");
  return near.length > 0 && near.every((c) => {
    const img = c.querySelector('[data-testid="preview"]');
    return !img.hidden && img.complete && img.naturalWidth > 0;
  });
}"""


async def finish(db_url: str, store: ObjectStore, file_id: uuid.UUID) -> None:
    """Play the worker for one card, through the protocol."""
    pool = await open_pool(db_url, min_size=1, max_size=2)
    try:
        queue = Queue(Database(pool), lease_seconds=600, max_attempts=3, retry_base_seconds=0,
                      retry_cap_seconds=0, worker="test")
        [lease] = [le for le in await queue.claim(5) if le.file_id == file_id]
        await queue.complete(lease, _photos(store)[0])
    finally:
        await pool.close()
