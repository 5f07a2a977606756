"""Every status change reaches the open pages (`NOTIFY darkroom_cards`) while they watch
(darkroom/watch.py), the re-derive and the expiry of unconfirmed uploads included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from darkroom.api.events import CHANNEL
from darkroom.queue import Queue
from darkroom.watch import Watch
from tests.queue.test_fair import add, derived_for
from tests.support.services import make_queue
from tests.support.sql import SQL

MARK = '{"o": []}'  # a notification of the test's own: it names no owner


def mark(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["notify_cards_channel"], {"payload": MARK})


async def notices(q: Queue, db_url: str,
                  during: Callable[[], Awaitable[Any]]) -> list[list[str]]:
    """The [owner, id, status] the statements run by `during()` sent to the pages: a mark
    sent after they committed comes after all of them (notifications come in commit
    order)."""
    got = []
    async with q.db.listen(CHANNEL) as notes:
        await during()
        await asyncio.to_thread(mark, db_url)
        while (note := await asyncio.wait_for(anext(notes), timeout=30)) != MARK:
            got += [list(change) for change in json.loads(note)["c"]]
    return got


async def changes(q: Queue, db_url: str,
                  during: Callable[[], Awaitable[Any]]) -> list[list[str]]:
    """`notices` while a page watches."""
    await Watch(q.db).turn_on()
    return await notices(q, db_url, during)


async def test_a_re_derive_tells_the_pages_its_cards_are_queued(pool: Any, db_url: str) -> None:
    q = make_queue(pool, fingerprint="old")
    [fid] = await add(q, "a")
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    new = make_queue(pool, fingerprint="new")
    assert await changes(new, db_url, lambda: new.rederive("a", "new")) == [
        ["a", str(fid), "queued"]]


async def test_an_unconfirmed_upload_that_expires_tells_the_pages(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    card = await q.create_file(owner="a", filename="a.jpg", content_type="image/jpeg", size=1)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_cards"], {"ids": [card.id]})
    assert await changes(q, db_url, lambda: q.expire_pending([card.id], ttl_seconds=60)) == [
        ["a", str(card.id), "deleting"]]
