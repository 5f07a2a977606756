"""The sweeper's units, in-process, against a real database and a real local store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from darkroom.canary import round_trip
from darkroom.db.database import Database
from darkroom.errors import StorageUnavailable
from darkroom.layout import (
    CANARY,
    canary_key,
    derived_key,
    derived_prefix,
    original_key,
    thumb_key,
)
from darkroom.queue import Derived, DerivedObject, Lease, Queue
from darkroom.reads import Reads
from darkroom.storage import ObjectStore, open_store
from darkroom.sweeper import (
    BATCH,
    DeletedFiles,
    Orphans,
    PendingExpiry,
    Reconcile,
    Sweeper,
    run_unit,
)
from tests.support.faults import through_proxy
from tests.support.services import confirm, make_queue, wait_for
from tests.support.sql import SQL, Attempt


class RefusingStore:
    """A real local store that refuses to delete some keys, as an object lock would."""

    def __init__(self, store: ObjectStore, refused: set[str]) -> None:
        self._store = store
        self.refused = refused

    def delete(self, key: str, version: str | None = None) -> None:
        if key in self.refused:
            raise StorageUnavailable("access denied")
        self._store.delete(key, version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "objects").as_uri())


async def queued_card(q: Queue, store: ObjectStore, owner: str = "o",
                      legacy: bool = False) -> uuid.UUID:
    """A queued card; `legacy`: its original at the key layout before owners were in it."""
    file_id = uuid.uuid4()
    card = await q.create_file(owner=owner, filename="a.jpg", content_type="image/jpeg",
                               size=3, file_id=file_id,
                               original_key=original_key(file_id, None) if legacy else None)
    version = await asyncio.to_thread(store.put, card.original_key, b"abc")
    await confirm(q, card.id, owner, version)
    return card.id


async def orphan(q: Queue, store: ObjectStore, lease: Lease) -> str:
    key = derived_key(lease)
    await asyncio.to_thread(store.put, key, b"webp")
    return key


def orphan_rows(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        return dict(conn.execute(SQL["orphan_failures"]).fetchall())


async def test_orphans_are_deleted_but_never_a_referenced_object(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    await queued_card(q, store)
    await queued_card(q, store)
    published, lost = await q.claim(2)
    kept = await orphan(q, store, published)
    gone = await orphan(q, store, lost)
    await q.complete(published, Derived(kept, "v", "0" * 64, 1, 1, 4))
    await q.revoke(lost.file_id, "o")
    # As an old bug did: the published key registered as an orphan after all.
    await q.track_attempt_objects(published, [kept])
    unit = Orphans(q.db, store, guard_seconds=0)
    # The revoked attempt's two keys (its thumb's too, though it wrote none), and `kept`.
    assert await unit.run_once() == 3
    assert orphan_rows(db_url) == {}
    assert [o.key for o in store.list(kept)] == [kept]
    assert list(store.list(gone)) == []


async def test_an_orphan_that_cannot_be_deleted_is_retried_and_holds_up_nothing(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    for _ in range(3):
        await queued_card(q, store)
    leases = await q.claim(3)
    keys = [await orphan(q, store, lease) for lease in leases]
    for lease in leases:
        await q.release([lease])
    unit = Orphans(q.db, RefusingStore(store, {keys[0]}), guard_seconds=0)
    assert await unit.run_once() == 5  # three attempts' previews and thumbs, but one
    assert orphan_rows(db_url) == {keys[0]: 1}
    assert await unit.run_once() == 0  # not due again before its backoff
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["retry_orphans_now"])
    unit.store = store  # the lock is lifted
    assert await unit.run_once() == 1
    assert orphan_rows(db_url) == {}


class LandingStore:
    """A real local store on which a stalled PUT of `key` lands while the sweeper deletes
    that key (after its delete, before its row is dropped), and the attempt that wrote it
    tracks it anew, as a worker does once its PUT returns."""

    def __init__(self, store: ObjectStore, key: str, land: Callable[[], None]) -> None:
        self._store = store
        self.key = key
        self._land: Callable[[], None] | None = land

    def delete(self, key: str, version: str | None = None) -> None:
        self._store.delete(key, version)
        if key == self.key and self._land is not None:
            land, self._land = self._land, None
            land()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_write_that_lands_while_its_orphan_is_swept_is_swept_too(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    await queued_card(q, store)
    [lease] = await q.claim(1)
    key = await orphan(q, store, lease)
    await q.release([lease])
    loop = asyncio.get_running_loop()

    def land() -> None:
        store.put(key, b"late webp")
        asyncio.run_coroutine_threadsafe(
            q.track_attempt_objects(lease, [key]), loop).result(timeout=30)

    unit = Orphans(q.db, LandingStore(store, key, land), guard_seconds=0)
    assert await unit.run_once() == 2  # the ended attempt's preview and thumb
    # The row the pass took is gone; the one the late write made stays, and its object.
    assert orphan_rows(db_url) == {key: 0}
    assert [o.key for o in store.list(key)] == [key]
    assert await unit.run_once() == 1
    assert orphan_rows(db_url) == {}
    assert list(store.list(key)) == []


class BeforeDrop:
    """The sweeper's database, running `hook` once just before a pass drops `key`'s row."""

    def __init__(self, db: Any, key: str, hook: Callable[[], Awaitable[None]]) -> None:
        self._db = db
        self.key = key
        self._hook: Callable[[], Awaitable[None]] | None = hook

    async def rows(self, name: str, params: dict[str, Any]) -> Any:
        if name == "sweep_drop_orphan" and params["key"] == self.key and self._hook:
            hook, self._hook = self._hook, None
            await hook()
        return await self._db.rows(name, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_published_key_tracked_anew_then_replaced_mid_pass_is_still_swept(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    """An attempt whose commit went through unheard tracks its (published) key anew; the
    sweeper takes that row and keeps the object, a card references it. A re-derive then
    replaces it before the pass drops the row: the replaced key's row is made new
    ('superseded', its own guard for readers), so the pass's drop leaves it for the next,
    which deletes the object."""
    q = make_queue(pool)
    await queued_card(q, store)
    [first] = await q.claim(1)
    old = await orphan(q, store, first)
    await q.complete(first, Derived(old, "v", "0" * 64, 1, 1, 4))
    await q.track_attempt_objects(first, [old])
    assert await q.rederive("o", "another-fingerprint") == 1
    [second] = await q.claim(1)
    new = await orphan(q, store, second)

    async def replace() -> None:
        await q.complete(second, Derived(new, "v", "0" * 64, 1, 1, 4))

    # The real gateway, its one call wrapped: typed as what it stands in for.
    unit = Orphans(cast(Database, BeforeDrop(q.db, old, replace)), store, guard_seconds=0)
    await unit.run_once()
    assert old in orphan_rows(db_url)
    assert [o.key for o in store.list(old)] == [old]
    await unit.run_once()
    assert old not in orphan_rows(db_url)
    assert list(store.list(old)) == []
    assert [o.key for o in store.list(new)] == [new]


async def test_attempts_still_running_never_hold_up_the_sweep(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    """A running attempt can have rows (its writes were tracked anew after a statement
    that would have ended it failed), skipped while its lease holds; a batch's worth of
    them, older than the guard interval, must not fill every pass and leave the ended
    attempts' objects for ever."""
    q = make_queue(pool)
    for _ in range(BATCH // 2):
        await queued_card(q, store, owner="busy")
    running = await q.claim(BATCH // 2)
    for lease in running:
        await q.track_attempt_objects(lease, [derived_key(lease), thumb_key(lease)])
    await queued_card(q, store, owner="o")
    [ended] = await q.claim(1)
    key = await orphan(q, store, ended)
    await q.release([ended])
    unit = Orphans(q.db, store, guard_seconds=0)
    assert await unit.run_once() == 2  # the ended attempt's preview and thumb
    assert list(store.list(key)) == []
    assert len(orphan_rows(db_url)) == 2 * len(running)  # the running ones', untouched


async def test_the_guard_counts_from_the_end_of_the_lease_whatever_was_tracked_before(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    """An attempt whose writes were tracked while its lease still held (a statement that
    would have ended it failed) and whose lease ends much later: a late write of a
    half-down store may land until the guard interval after the end, so its objects are
    not deleted before."""
    q = make_queue(pool)
    await queued_card(q, store)
    [lease] = await q.claim(1)
    key = await orphan(q, store, lease)
    await q.track_attempt_objects(lease, [key])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_orphans"])
    await q.release([lease])
    unit = Orphans(q.db, store, guard_seconds=600)
    assert await unit.run_once() == 0
    assert [o.key for o in store.list(key)] == [key]
    assert await Orphans(q.db, store, guard_seconds=0).run_once() == 2


async def test_two_sweepers_share_the_orphans(pool: Any, db_url: str,
                                              store: ObjectStore) -> None:
    q = make_queue(pool)
    cards = (BATCH + BATCH // 2) // 2
    for _ in range(cards):
        await queued_card(q, store)
    leases = await q.claim(cards)
    for lease in leases:
        await orphan(q, store, lease)
    await q.release(leases)
    units = [Orphans(q.db, store, guard_seconds=0) for _ in range(2)]
    done = await asyncio.gather(*(u.run_once() for u in units))
    # Two keys an attempt (preview and thumb): more than one pass's batch.
    assert sum(done) == 2 * cards and min(done) > 0
    assert orphan_rows(db_url) == {}


async def test_deleted_files_lose_every_byte_then_the_card(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    file_id = await queued_card(q, store)
    [lease] = await q.claim(1)
    await orphan(q, store, lease)
    await q.revoke(file_id, "o")
    refusing = RefusingStore(store, {original_key(file_id, 'o')})
    unit = DeletedFiles(q, refusing, guard_seconds=0)
    assert await unit.run_once() == 0  # refused: tried again later, the card stays
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["make_due"])
    refusing.refused.clear()
    assert await unit.run_once() == 1
    assert list(store.list(original_key(file_id, "o"))) == []
    assert list(store.list(derived_prefix(file_id))) == []
    assert await Reads(q.db).get_file(file_id, "o") is None


async def test_reconcile_deletes_only_what_nothing_accounts_for(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    file_id = await queued_card(q, store)
    [lease] = await q.claim(1)
    key = derived_key(lease)
    version = store.put(key, b"webp2")
    await q.complete(lease, Derived(key, version, "0" * 64, 1, 1, 5))
    stray_original = original_key(uuid.uuid4(), "o")  # bytes that landed after a purge
    store.put(stray_original, b"late")
    stray_derived = derived_key(Attempt(file_id, uuid.uuid4()))  # a restore forgot it
    store.put(stray_derived, b"old")
    extra_version = store.put(original_key(file_id, "o"), b"second upload, never confirmed")
    unit = Reconcile(q.db, store, guard_seconds=0)
    dry = await unit.run(dry_run=True)
    expected = {f"{stray_original}@", f"{stray_derived}@", f"{original_key(file_id, 'o')}@"}
    assert {item.split("@")[0] + "@" for item in dry.unaccounted} == expected
    assert any(item.endswith(extra_version) for item in dry.unaccounted)
    assert dry.deleted == 0 and any(store.list(stray_original))
    # On its own, reconcile deletes only the derivative: an original no card accounts
    # for may be a user's upload whose record was lost, and is only reported.
    done = await unit.run(dry_run=False)
    assert done.deleted == 1
    assert {item.split("@")[0] for item in done.kept} == {stray_original,
                                                          original_key(file_id, "o")}
    assert done.kept[f"{original_key(file_id, 'o')}@{extra_version}"] == (
        "its card holds another version")
    assert store.get(stray_original, next(iter(store.list(stray_original))).version) == b"late"
    assert store.get(original_key(file_id, "o"), extra_version) == b"second upload, never confirmed"
    # Deleting them is the operator's explicit choice.
    chosen = await unit.run(dry_run=False, delete_originals=True)
    assert chosen.deleted == 2 and chosen.kept == {}
    again = await unit.run(dry_run=False)
    assert again.unaccounted == []
    card = await Reads(q.db).get_file(file_id, "o")
    assert card is not None
    assert card.original_version is not None
    assert store.get(card.original_key, card.original_version) == b"abc"
    assert store.get(key, version) == b"webp2"


async def test_reconcile_restore_makes_cards_for_old_layout_originals_whose_record_was_lost(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    # Cards made before owners were in the key: their originals are at the old form.
    lost = await queued_card(q, store, owner="alice", legacy=True)
    newest = store.put(original_key(lost, None), b"abcd")  # its latest upload (never confirmed)
    deleted = await queued_card(q, store, owner="alice", legacy=True)
    await q.revoke(deleted, "alice")
    with psycopg.connect(db_url, autocommit=True) as conn:
        # As a failover that lost acknowledged commits leaves them: the bytes, no card.
        conn.execute(SQL["drop_cards"], {"ids": [lost]})
        conn.execute(SQL["drop_cards"], {"ids": [deleted]})
    unit = Reconcile(q.db, store, guard_seconds=0, queue=q)
    dry = await unit.run(dry_run=True, restore=True, owner="alice")
    assert dry.restored == {f"{original_key(lost, None)}@{newest}": "alice"}
    assert await Reads(q.db).get_file(lost, "alice") is None
    # Without an owner, and with no single owner holding API keys, nothing is restored.
    unknown = await unit.run(dry_run=False, restore=True)
    assert unknown.restored == {} and await Reads(q.db).get_file(lost, "alice") is None
    assert "--owner" in unknown.kept[f"{original_key(lost, None)}@{newest}"]
    done = await unit.run(dry_run=False, restore=True, owner="alice")
    assert done.restored == {f"{original_key(lost, None)}@{newest}": "alice"}
    assert done.deleted == 0
    # The deleted file's bytes are not brought back: its history says it was deleted.
    assert {v: why for v, why in done.kept.items() if v.startswith(original_key(deleted, None))}
    assert all(why == "its file was deleted" for v, why in done.kept.items()
               if v.startswith(original_key(deleted, None)))
    card = await Reads(q.db).get_file(lost, "alice")
    assert card is not None and card.status == "queued"
    assert (card.original_version, card.size_bytes) == (newest, 4)
    assert [e.kind for e in await Reads(q.db).events(lost)][-1] == "restored"
    [lease] = await q.claim(1)
    assert lease.file_id == lost and lease.original_version == newest
    again = await unit.run(dry_run=False, restore=True, owner="alice")
    assert again.restored == {}
    assert all(v.startswith(original_key(lost, None)) is False or why.startswith("its card")
               for v, why in again.kept.items())


async def test_reconcile_restore_gives_a_lost_original_to_the_owner_its_key_names(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    from darkroom.keys import create_key

    q = make_queue(pool)
    for owner in ("alice", "bob"):  # two owners: no single one to fall back on
        await create_key(q.db, owner)
    lost = await queued_card(q, store, owner="bob")
    old = await queued_card(q, store, owner="alice", legacy=True)
    versions = {i: next(iter(store.list(original_key(i, o)))).version
                for i, o in ((lost, "bob"), (old, None))}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["drop_cards"], {"ids": [lost, old]})
    unit = Reconcile(q.db, store, guard_seconds=0, queue=q)
    plain = await unit.run(dry_run=False)
    assert plain.restored == {}
    assert plain.kept == {
        f"{original_key(lost, 'bob')}@{versions[lost]}":
            "no card holds it; --restore gives it to bob (named in its key)",
        f"{original_key(old, None)}@{versions[old]}":
            "no card holds it and its key names no owner;"
            " restore it with --restore --owner NAME"}
    done = await unit.run(dry_run=False, restore=True)
    # The key names bob; the old-form key names no one, and no --owner says who.
    assert done.restored == {f"{original_key(lost, 'bob')}@{versions[lost]}": "bob"}
    assert list(done.kept) == [f"{original_key(old, None)}@{versions[old]}"]
    card = await Reads(q.db).get_file(lost, "bob")
    assert card is not None and card.status == "queued"
    assert (card.original_key, card.original_version) == (original_key(lost, "bob"),
                                                           versions[lost])
    assert await Reads(q.db).get_file(lost, "alice") is None
    assert await Reads(q.db).get_file(old, "alice") is None
    # With --owner, the old-form key's card keeps the key its bytes are at.
    named = await unit.run(dry_run=False, restore=True, owner="alice")
    assert named.restored == {f"{original_key(old, None)}@{versions[old]}": "alice"}
    restored = await Reads(q.db).get_file(old, "alice")
    assert restored is not None and restored.original_key == original_key(old, None)
    assert [e.kind for e in await Reads(q.db).events(lost)][-1] == "restored"


async def test_an_expired_pending_card_whose_upload_is_stored_is_confirmed_not_purged(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    import hashlib

    q = make_queue(pool)

    async def pending(body: bytes | None, size: int = 3, sha256: str | None = None
                      ) -> uuid.UUID:
        card = await q.create_file_keyed(owner="o", filename="a.jpg",
                                         content_type="image/jpeg", size=size, sha256=sha256)
        assert card is not None
        if body is not None:
            await asyncio.to_thread(store.put, card.original_key, body)
        return card.id

    stored = await pending(b"abc")  # its confirm was lost with a failed-over database
    digest = hashlib.sha256(b"xyz").hexdigest()
    claimed = await pending(b"xyz", sha256=digest)
    wrong_digest = await pending(b"xyw", sha256=digest)
    never = await pending(None)  # the client never uploaded
    short = await pending(b"ab")  # the upload was cut short
    superseded = await pending(b"abc")
    await asyncio.to_thread(store.put, original_key(superseded, "o"), b"abcdef")  # latest: wrong
    young = await pending(None)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_cards_but"], {"id": young})
    sweeper = Sweeper(q, store, guard_seconds=0, retention_seconds=86_400,
                      pending_ttl_seconds=86_400)
    report = await sweeper.sweep_once()
    assert (report.pending_confirmed, report.pending_expired) == (2, 4)
    for file_id in (stored, claimed):
        card = await Reads(q.db).get_file(file_id, "o")
        assert card is not None and card.status == "queued"
        assert card.original_version == next(iter(store.list(original_key(file_id, "o")))).version
        assert [e.kind for e in await Reads(q.db).events(file_id)] == ["upload_found"]
    for file_id in (wrong_digest, never, short, superseded):
        assert await Reads(q.db).get_file(file_id, "o") is None
        assert list(store.list(original_key(file_id, "o"))) == []
    young_card = await Reads(q.db).get_file(young, "o")
    assert young_card is not None and young_card.status == "pending"
    claimed_ids = {lease.file_id for lease in await q.claim(5)}
    assert claimed_ids == {stored, claimed}
    assert not await sweeper.sweep_once()  # nothing more is due


async def test_a_found_upload_takes_its_place_in_its_owners_line(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    """Queued by the sweeper, a card whose confirm was lost is stamped by the rule of every
    stamp (fair share): behind its owner's own waiting cards, not at the head of the line."""
    q = make_queue(pool)
    waiting = [await queued_card(q, store) for _ in range(2)]
    card = await q.create_file_keyed(owner="o", filename="a.jpg", content_type="image/jpeg",
                                     size=3, sha256=None)
    assert card is not None
    await asyncio.to_thread(store.put, card.original_key, b"abc")
    sweeper = Sweeper(q, store, guard_seconds=0, retention_seconds=86_400,
                      pending_ttl_seconds=0)
    assert (await sweeper.sweep_once()).pending_confirmed == 1
    with psycopg.connect(db_url) as conn:
        stamps: dict[uuid.UUID, float] = dict(conn.execute(SQL["fair_stamps"]).fetchall())
    assert stamps[card.id] > max(stamps[w] for w in waiting), stamps
    assert [lease.file_id for lease in await q.claim(3)] == [*waiting, card.id]


async def test_pending_cards_wait_while_the_store_cannot_be_read(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    card = await q.create_file(owner="o", filename="a.jpg", content_type="image/jpeg", size=3)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_every_card"])

    class DownStore(RefusingStore):
        def list(self, prefix: str) -> Any:
            raise StorageUnavailable("down")

    unit = PendingExpiry(q, DownStore(store, set()), 86_400)
    with pytest.raises(StorageUnavailable):
        await unit.run_once()
    still = await Reads(q.db).get_file(card.id, "o")
    assert still is not None and still.status == "pending"


async def test_reconcile_keeps_a_published_thumb_and_deletes_a_stray_one(
        pool: Any, db_url: str, store: ObjectStore) -> None:
    q = make_queue(pool)
    file_id = await queued_card(q, store)
    [lease] = await q.claim(1)
    key, small = derived_key(lease), thumb_key(lease)
    version, small_version = store.put(key, b"preview"), store.put(small, b"thumb")
    thumb = DerivedObject(small, small_version, "1" * 64, 1, 1, 5)
    await q.complete(lease, Derived(key, version, "0" * 64, 2, 2, 7, thumb=thumb,
                                    thumbhash="AAAA"))
    stray = thumb_key(Attempt(file_id, uuid.uuid4()))  # an attempt's, never published
    store.put(stray, b"old thumb")
    unit = Reconcile(q.db, store, guard_seconds=0)
    done = await unit.run(dry_run=False)
    assert {item.split("@")[0] for item in done.unaccounted} == {stray}
    assert store.get(small, small_version) == b"thumb"
    assert store.get(key, version) == b"preview"
    assert orphan_rows(db_url) == {}


async def test_reconcile_runs_once_per_interval_across_sweepers(
        pool: Any, store: ObjectStore) -> None:
    q = make_queue(pool)
    units = [Reconcile(q.db, store, guard_seconds=0, interval_seconds=3600)
             for _ in range(2)]
    await asyncio.gather(*(u.run_once() for u in units))
    with psycopg.connect(pool.conninfo) as conn:
        row = conn.execute(SQL["schedule"]).fetchone()
    assert row == (1, True)
    took = [await q.db.rows("sweep_take_turn",
                                   {"unit": "reconcile", "interval_seconds": 3600})]
    assert took == [[]]


async def test_a_database_outage_pauses_a_unit_and_never_ends_it(
        db_url: str, store: ObjectStore) -> None:
    from darkroom.db.connection import open_pool

    proxy, url = through_proxy(db_url)
    pool = await open_pool(url, min_size=1, max_size=2, fail_fast=False)
    stop = asyncio.Event()
    try:
        q = make_queue(pool)
        sweeper = Sweeper(q, store, guard_seconds=0, retention_seconds=86_400)
        proxy.refuse()
        task = asyncio.create_task(run_unit(sweeper.orphans, stop, interval_seconds=0.05))
        await asyncio.to_thread(
            wait_for, lambda: pool.get_stats().get("connections_errors") or task.done(),
            what="the unit to meet the outage")
        assert not task.done()
        proxy.heal()
        direct = make_queue(await open_pool(db_url, min_size=1, max_size=1))
        try:
            await queued_card(direct, store)
            [lease] = await direct.claim(1)
            await orphan(direct, store, lease)
            await direct.release([lease])
        finally:
            await direct.db.close()
        await asyncio.to_thread(wait_for, lambda: orphan_rows(db_url) == {}, timeout=120,
                                what="the unit to work again")
        assert not task.done()
    finally:
        stop.set()
        await pool.close()
        proxy.close()


async def test_the_probes_canary_leaves_nothing_and_reconcile_never_lists_one(
        pool: Any, store: ObjectStore) -> None:
    """The store breaker's probe writes, reads back and deletes its canary; one left by a
    probe cut short lies under the reserved prefix, which is no card's: reconcile leaves
    it alone."""
    round_trip(store)
    assert list(store.list(CANARY)) == []
    left = canary_key(uuid.uuid4())
    version = store.put(left, b"a probe cut short")
    q = make_queue(pool)
    done = await Reconcile(q.db, store, guard_seconds=0).run(dry_run=False)
    assert done.unaccounted == [] and done.deleted == 0
    assert store.get(left, version) == b"a probe cut short"
