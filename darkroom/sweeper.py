"""The sweeper: deferred clean-up of bytes that no card will ever show.

It is a set of small independent units, each with a run-once entry point that does one
bounded batch and answers how much it did:
- `orphans`: derivative objects written by attempts that never published (lease lost,
  crashed between PUT and commit, revoked) are deleted, every version, after a guard
  interval; an object a card references is never deleted, whatever its row says;
- `deleted`: every byte of a deleted card (every version of the original and of every
  derivative), then the card itself, after the guard interval;
- `events`: events older than the retention are pruned;
- `idempotency_keys`: keys of creates older than 24 hours are pruned (darkroom/uploads.py);
- `reconcile`: objects under originals/ and derived/ that no card and no orphan row
  accounts for, older than the guard interval, are deleted (once per interval across all
  sweepers; `darkroom reconcile [--dry-run]` runs it on demand).

Each unit takes its batch in one committed statement, then calls the store with no lock
or snapshot held, so several sweepers share the work and a slow store holds no rows. An
object that cannot be deleted is retried with backoff and reported, never halting the
rest. A database or store outage pauses a unit, never ends the sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg

from darkroom import metrics
from darkroom.card import PendingCard
from darkroom.config import Settings
from darkroom.db.database import CONNECTION_ERRORS, Database
from darkroom.errors import ObjectMissing, StorageError
from darkroom.layout import ATTEMPT_KEYS, DERIVED, ORIGINALS, derived_prefix, parse_key
from darkroom.queue import ConfirmOutcome, Queue
from darkroom.reads import Reads
from darkroom.services import prepare
from darkroom.storage import LocalStore, ObjectStore
from darkroom.storage.base import ObjectVersion
from darkroom.uploads import KEY_RETENTION_SECONDS

log = logging.getLogger("darkroom.sweeper")

BATCH = 100
# One batch's time budget: a unit stops taking new items past it (what it took and did not
# reach is taken again once its next try comes).
BATCH_SECONDS = 20.0
# A taken item is not taken again for this long (the time its sweeper has to finish it).
TAKE_SECONDS = 120.0
# Failed deletes are retried after base·2^failures seconds, capped.
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 3_600.0
# Between batches of a unit that still has work, and the longest outage backoff.
PAUSE_SECONDS = 0.05
OUTAGE_CAP_SECONDS = 60.0
RECONCILE_INTERVAL_SECONDS = 3_600.0
RECONCILE_PAGE = 500
PRUNE_BATCH = 5_000
# Attempts that ended unpublished, made into their keys' rows per orphan pass: cheap rows
# (no store call), so a pass moves far more than it deletes, and a burst of failures or
# deferrals never waits an interval per hundred.
MOVE_BATCH = 1_000

# What an outage of the database or the store raises; anything else is logged as a bug,
# and the unit still goes on after a pause.
OUTAGES = (*CONNECTION_ERRORS, StorageError, OSError)


class Unit(Protocol):
    """One duty of the sweeper."""

    name: str

    async def run_once(self) -> int:
        """One bounded batch; answers how many items it finished (0: nothing due)."""
        ...


@dataclass
class Budget:
    """A batch's time budget."""

    seconds: float = BATCH_SECONDS
    start: float = field(default_factory=time.monotonic)

    def spent(self) -> bool:
        return time.monotonic() - self.start > self.seconds


class Orphans:
    name = "orphans"

    def __init__(self, db: Database, store: ObjectStore, guard_seconds: float) -> None:
        self.db = db
        self.store = store
        self.guard_seconds = guard_seconds

    async def run_once(self) -> int:
        # Attempts that ended unpublished since the last pass become their keys' rows.
        await self.db.rowcount("sweep_unpublished_attempts",
                               {"limit": MOVE_BATCH, "attempt_keys": list(ATTEMPT_KEYS)})
        rows = await self.db.rows("sweep_take_orphans", {
            "guard_seconds": self.guard_seconds, "limit": BATCH,
            "retry_seconds": TAKE_SECONDS})
        budget = Budget()
        done = 0
        for row in rows:
            if budget.spent():
                break
            key = row["object_key"]
            if not row["referenced"]:
                try:
                    await asyncio.to_thread(self.store.delete, key)
                except StorageError as exc:
                    await self._failed(key, exc)
                    continue
            await self.db.rows("sweep_drop_orphan",
                               {"key": key, "created_at": row["created_at"]})
            metrics.SWEEP_DONE.labels(self.name).inc()
            done += 1
            log.info("orphan kept: a card references it" if row["referenced"]
                     else "orphan deleted",
                     extra={"file_id": str(row["file_id"]), "token": str(row["token"])[:8],
                            "reason": row["reason"]})
        return done

    async def _failed(self, key: str, exc: StorageError) -> None:
        metrics.SWEEP_DELETE_FAILURES.labels(self.name).inc()
        rows = await self.db.rows("sweep_orphan_failed", {
            "key": key, "base_seconds": RETRY_BASE_SECONDS, "cap_seconds": RETRY_CAP_SECONDS})
        log.warning("orphan could not be deleted; retrying later",
                    extra={"key": key, "error": type(exc).__name__,
                           "failures": rows[0]["failures"] if rows else None})


class DeletedFiles:
    name = "deleted"

    def __init__(self, queue: Queue, store: ObjectStore, guard_seconds: float) -> None:
        self.queue = queue
        self.store = store
        self.guard_seconds = guard_seconds

    async def run_once(self) -> int:
        cards = await self.queue.take_deleted(
            guard_seconds=self.guard_seconds, limit=BATCH, retry_seconds=RETRY_BASE_SECONDS)
        budget = Budget()
        done = 0
        for file_id, original in cards:
            if budget.spent():
                break
            try:
                await asyncio.to_thread(self._delete_bytes, file_id, original)
            except StorageError as exc:
                # The card's next try is already RETRY_BASE_SECONDS ahead.
                metrics.SWEEP_DELETE_FAILURES.labels(self.name).inc()
                log.warning("deleted file's bytes could not be deleted; retrying later",
                            extra={"file_id": str(file_id), "error": type(exc).__name__})
                continue
            await self.queue.purge_card(file_id)
            metrics.SWEEP_DONE.labels(self.name).inc()
            done += 1
            log.info("file purged", extra={"file_id": str(file_id)})
        return done

    def _delete_bytes(self, file_id: uuid.UUID, original: str) -> None:
        self.store.delete(original)
        for obj in list(self.store.list(derived_prefix(file_id))):
            self.store.delete(obj.key, obj.version)


class Events:
    name = "events"

    def __init__(self, db: Database, retention_seconds: float) -> None:
        self.db = db
        self.retention_seconds = retention_seconds

    async def run_once(self) -> int:
        pruned = await self.db.rowcount("sweep_prune_events", {
            "retention_seconds": self.retention_seconds, "limit": PRUNE_BATCH})
        metrics.SWEEP_DONE.labels(self.name).inc(pruned)
        # A short batch means nothing more is due now.
        return pruned if pruned == PRUNE_BATCH else 0


class IdempotencyKeys:
    name = "idempotency_keys"

    def __init__(self, db: Database, retention_seconds: float = KEY_RETENTION_SECONDS) -> None:
        self.db = db
        self.retention_seconds = retention_seconds
        self.pruned = 0  # in all, for the --once report

    async def run_once(self) -> int:
        pruned = await self.db.rowcount("sweep_idempotency_keys", {
            "retention_seconds": self.retention_seconds, "limit": PRUNE_BATCH})
        metrics.SWEEP_DONE.labels(self.name).inc(pruned)
        self.pruned += pruned
        # A short batch means nothing more is due now.
        return pruned if pruned == PRUNE_BATCH else 0


@dataclass
class ReconcileReport:
    examined: int = 0
    unaccounted: list[str] = field(default_factory=list)
    deleted: int = 0
    # Unaccounted originals, kept (`key@version`: why): reconcile never deletes one on
    # its own, since a lost record (a failover, an older backup) leaves a user's upload
    # exactly so.
    kept: dict[str, str] = field(default_factory=dict)
    # Originals given a card again (`key@version`: owner).
    restored: dict[str, str] = field(default_factory=dict)


class Reconcile:
    """Objects nothing accounts for: the reconciliation after a restore, and the net under
    every other path (an upload that landed after its card was purged, say).

    Derivatives nothing accounts for are deleted (a card can always make its own again).
    Originals are only reported: `restore` gives a card to each one no card holds, and
    `delete_originals` deletes them, each an operator's explicit choice.
    """

    name = "reconcile"

    def __init__(self, db: Database, store: ObjectStore, guard_seconds: float, *,
                 interval_seconds: float = RECONCILE_INTERVAL_SECONDS,
                 queue: Queue | None = None) -> None:
        self.db = db
        self.store = store
        self.guard_seconds = guard_seconds
        self.interval_seconds = interval_seconds
        self.queue = queue

    async def run_once(self) -> int:
        """Once per interval across all sweepers: the one that takes the turn runs it."""
        turn = await self.db.rows("sweep_take_turn", {
            "unit": self.name, "interval_seconds": self.interval_seconds})
        if not turn:
            return 0
        report = await self.run(dry_run=False)
        # The whole pass is one item: the next one is an interval away.
        log.info("reconciled", extra={"examined": report.examined, "deleted": report.deleted})
        if report.kept:
            log.warning("originals no card accounts for were kept; see darkroom reconcile",
                        extra={"kept": len(report.kept)})
        return 0

    async def run(self, *, dry_run: bool, restore: bool = False,
                  delete_originals: bool = False, owner: str | None = None
                  ) -> ReconcileReport:
        """Every object under the layout's prefixes, a page at a time."""
        report = ReconcileReport()
        cutoff = datetime.now(UTC) - timedelta(seconds=self.guard_seconds)
        for prefix in (ORIGINALS, DERIVED):
            pages = _pages(self.store, prefix)
            while True:
                page = await asyncio.to_thread(next, pages, None)
                if page is None:
                    break
                old = [o for o in page if o.modified is None or o.modified < cutoff]
                report.examined += len(page)
                for key, version in await self._unaccounted(old):
                    report.unaccounted.append(f"{key}@{version}")
                    if prefix == ORIGINALS and not delete_originals:
                        report.kept[f"{key}@{version}"] = "no card accounts for it"
                        continue
                    if dry_run:
                        continue
                    try:
                        await asyncio.to_thread(self.store.delete, key, version)
                    except StorageError as exc:
                        metrics.SWEEP_DELETE_FAILURES.labels(self.name).inc()
                        log.warning("unaccounted object could not be deleted",
                                    extra={"key": key, "error": type(exc).__name__})
                        continue
                    report.deleted += 1
                    metrics.SWEEP_DONE.labels(self.name).inc()
                    log.info("unaccounted object deleted", extra={"key": key})
        if report.kept:
            await self._explain(report, restore=restore, dry_run=dry_run, owner=owner)
        return report

    async def _explain(self, report: ReconcileReport, *, restore: bool, dry_run: bool,
                       owner: str | None) -> None:
        """Why each kept original has no card, and with `restore`, a card for each one
        that no card holds and that was not deleted by its owner."""
        # Per stored key (a card's original has one key; an old-form and a new-form key
        # of one id are two objects, each restored or kept on its own).
        versions: dict[str, list[str]] = {}
        named: dict[str, tuple[uuid.UUID, str | None]] = {}
        for item in report.kept:
            key, _, version = item.rpartition("@")
            parsed = parse_key(key)
            if parsed is not None:
                versions.setdefault(key, []).append(version)
                named[key] = (parsed.file_id, parsed.owner)
        rows = await self.db.rows("reconcile_cardless",
                                  {"ids": list({i for i, _ in named.values()})})
        cardless = {r["id"]: bool(r["deleted"]) for r in rows}
        fallback = owner
        if fallback is None and any(o is None for _, o in named.values()):
            owners = [r["owner"] for r in await self.db.rows("reconcile_owners")]
            fallback = owners[0] if len(owners) == 1 else None
        for key, kept in versions.items():
            file_id, key_owner = named[key]
            # The key names its owner (the layout since owners are in it); an old-form key
            # does not, and then --owner, or the one owner with API keys, is taken.
            whose = key_owner if key_owner is not None else fallback
            if file_id not in cardless:
                why = "its card holds another version"
            elif cardless[file_id]:
                why = "its file was deleted"
            elif whose is None:
                why = ("no card holds it and its key names no owner;"
                       " restore it with --restore --owner NAME")
            elif key_owner is None:
                why = (f"no card holds it and its key names no owner; --restore gives it"
                       f" to {whose} ({'--owner' if owner is not None else 'the one owner'})")
            else:
                why = f"no card holds it; --restore gives it to {whose} (named in its key)"
            for version in kept:
                report.kept[f"{key}@{version}"] = why
            if not restore or file_id not in cardless or cardless[file_id] or whose is None:
                continue
            newest = await asyncio.to_thread(self._newest, key)
            if newest is None:
                continue
            if not dry_run and not await self._restore(file_id, newest, whose):
                continue
            report.restored[f"{key}@{newest.version}"] = whose
            report.kept.pop(f"{key}@{newest.version}", None)

    def _newest(self, key: str) -> ObjectVersion | None:
        return next((o for o in self.store.list(key) if o.key == key), None)

    async def _restore(self, file_id: uuid.UUID, obj: ObjectVersion, owner: str) -> bool:
        """A card for a stored original, made as the API makes one: created, then confirmed
        for exactly this version (then processed like any other), with its history, in one
        transaction (`Queue.restore_card`): a run whose answer was lost made all of it or
        nothing, and run again finds the original held or restores it then."""
        assert self.queue is not None, "a restore needs the queue"
        info = await asyncio.to_thread(self.store.head, obj.key, obj.version)
        try:
            if not await self.queue.restore_card(file_id, owner, key=obj.key,
                                                 version=obj.version, size=info.size,
                                                 content_type=info.content_type):
                return False
        except psycopg.errors.UniqueViolation:
            # Restored just now by another run, whose card holds this very version.
            done = await self.queue.confirm_card(file_id, owner, obj.version, size=info.size)
            return done.outcome is ConfirmOutcome.ALREADY
        log.warning("original restored: a card was made for it",
                    extra={"file_id": str(file_id), "owner": owner})
        return True

    async def _unaccounted(self, objects: list[ObjectVersion]) -> list[tuple[str, str]]:
        if not objects:
            return []
        parsed = [parse_key(o.key) for o in objects]
        rows = await self.db.rows("reconcile_unaccounted", {
            "keys": [o.key for o in objects],
            "versions": [o.version for o in objects],
            "file_ids": [p.file_id if p else None for p in parsed],
            "kinds": [p.kind if p else None for p in parsed],
            "tokens": [p.token if p else None for p in parsed],
        })
        return [(r["object_key"], r["version"]) for r in rows]


def _pages(store: ObjectStore, prefix: str) -> Iterator[list[ObjectVersion]]:
    page: list[ObjectVersion] = []
    for obj in store.list(prefix):
        page.append(obj)
        if len(page) >= RECONCILE_PAGE:
            yield page
            page = []
    if page:
        yield page


class PendingExpiry:
    """Unconfirmed cards past `DARKROOM_PENDING_TTL_SECONDS`: each one's upload is looked
    for in the store first. A card whose latest upload has the declared size (and the
    claimed digest) is confirmed (`Queue.confirm_found_upload`): its confirm was never sent
    or was lost with a failed-over database, and its bytes are the user's. The others
    become deleted cards (`Queue.expire_pending`), which the `deleted` unit purges.

    A store that cannot be read pauses the unit (an outage): no card is expired while
    its upload cannot be looked for.
    """

    name = "pending"

    def __init__(self, queue: Queue, store: ObjectStore, ttl_seconds: float) -> None:
        self.queue = queue
        self.reads = Reads(queue.db)
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.confirmed = 0  # in all, for the --once report

    async def run_once(self) -> int:
        cards = await self.reads.pending_due(ttl_seconds=self.ttl_seconds, limit=BATCH)
        doomed: list[uuid.UUID] = []
        done = 0
        for card in cards:
            found = await asyncio.to_thread(self._stored_upload, card)
            if found is None:
                doomed.append(card.id)
                continue
            version, sha256 = found
            if await self.queue.confirm_found_upload(card, ttl_seconds=self.ttl_seconds,
                                                     version=version, sha256=sha256):
                self.confirmed += 1
                done += 1
                metrics.SWEEP_DONE.labels(self.name).inc()
                log.warning("pending card confirmed: its upload is stored",
                            extra={"file_id": str(card.id)})
        ids = await self.queue.expire_pending(doomed, ttl_seconds=self.ttl_seconds)
        for file_id in ids:
            metrics.SWEEP_DONE.labels(self.name).inc()
            log.info("pending card expired", extra={"file_id": str(file_id)})
        return done + len(ids)

    def _stored_upload(self, card: PendingCard) -> tuple[str, str | None] | None:
        """The card's latest upload when it has the declared size (and the claimed digest),
        with its digest when one was claimed; None when there is no such upload."""
        for obj in self.store.list(card.original_key):
            if obj.key != card.original_key:
                continue
            # Versions of one key come newest first: only the latest upload counts, as
            # for a client that confirms it.
            if obj.size != card.size_bytes:
                return None
            if card.original_sha256 is None:
                return obj.version, None
            try:
                digest = self.store.digest(obj.key, obj.version)
            except ObjectMissing:  # deleted since it was listed
                return None
            return (obj.version, digest) if digest == card.original_sha256 else None
        return None


@dataclass
class SweepReport:
    orphans_deleted: int = 0
    files_purged: int = 0
    events_pruned: int = 0
    keys_pruned: int = 0
    pending_expired: int = 0
    pending_confirmed: int = 0

    def __bool__(self) -> bool:
        return bool(self.orphans_deleted or self.files_purged or self.events_pruned
                    or self.keys_pruned or self.pending_expired or self.pending_confirmed)


class Sweeper:
    def __init__(self, queue: Queue, store: ObjectStore, *, guard_seconds: float,
                 retention_seconds: float, pending_ttl_seconds: float = 86_400) -> None:
        db = queue.db
        self.pending = PendingExpiry(queue, store, pending_ttl_seconds)
        self.orphans = Orphans(db, store, guard_seconds)
        self.deleted = DeletedFiles(queue, store, guard_seconds)
        self.events = Events(db, retention_seconds)
        self.reconcile = Reconcile(db, store, guard_seconds, queue=queue)
        self.keys = IdempotencyKeys(db)
        self.units: list[Unit] = [self.pending, self.orphans, self.deleted, self.events,
                                  self.reconcile, self.keys]

    async def sweep_once(self) -> SweepReport:
        """Every batch of the routine units until nothing is due (not reconciliation)."""
        report = SweepReport()
        confirmed = self.pending.confirmed
        while (n := await self.pending.run_once()) > 0:
            report.pending_expired += n
        report.pending_confirmed = self.pending.confirmed - confirmed
        report.pending_expired -= report.pending_confirmed
        while (n := await self.orphans.run_once()) > 0:
            report.orphans_deleted += n
        while (n := await self.deleted.run_once()) > 0:
            report.files_purged += n
        while (n := await self.events.run_once()) > 0:
            report.events_pruned += n
        before = self.keys.pruned
        while await self.keys.run_once() > 0:
            pass
        report.keys_pruned = self.keys.pruned - before
        return report

    async def run(self, stop: asyncio.Event, *, interval_seconds: float) -> None:
        """Every unit in its own loop until `stop`; none ends the others."""
        await asyncio.gather(*(run_unit(unit, stop, interval_seconds=interval_seconds)
                               for unit in self.units))


async def run_unit(unit: Unit, stop: asyncio.Event, *, interval_seconds: float,
                   rng: random.Random | None = None) -> None:
    """A unit's loop: batches back to back while it has work, then a jittered wait; an
    outage pauses it with a growing backoff, and nothing but `stop` ends it."""
    rng = rng or random.Random()
    outage = 0
    while not stop.is_set():
        try:
            done = await unit.run_once()
            outage = 0
            wait = PAUSE_SECONDS if done else interval_seconds * rng.uniform(0.5, 1.5)
        except OUTAGES as exc:
            outage += 1
            wait = min(OUTAGE_CAP_SECONDS, 2.0 ** outage) * rng.uniform(0.5, 1.0)
            metrics.SWEEP_ERRORS.labels(unit.name).inc()
            log.warning("sweeper unit paused by an outage",
                        extra={"unit": unit.name, "error": type(exc).__name__,
                               "retry_in": round(wait, 1)})
        except Exception:
            outage += 1
            wait = min(OUTAGE_CAP_SECONDS, 2.0 ** outage)
            metrics.SWEEP_ERRORS.labels(unit.name).inc()
            log.exception("sweeper unit failed", extra={"unit": unit.name})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait)


async def _with_sweeper(settings: Settings,
                        body: Callable[[Sweeper], Awaitable[Any]]) -> Any:
    conninfo, store = await prepare(settings)
    db = await Database.open(conninfo, min_size=1, max_size=2, name="sweeper", fail_fast=False)
    try:
        sweeper = Sweeper(Queue.from_settings(db, settings, worker="sweeper"), store,
                          guard_seconds=settings.sweep_guard_seconds,
                          retention_seconds=settings.event_retention_days * 86_400,
                          pending_ttl_seconds=settings.pending_ttl_seconds)
        return await body(sweeper)
    finally:
        await db.close()


def remove_stale_temporaries(store: ObjectStore) -> None:
    """The local store's leftovers of puts a crash cut short (once per sweeper start:
    it walks the whole store)."""
    if isinstance(store, LocalStore):
        try:
            store.remove_stale_temporaries()
        except OSError as exc:
            log.warning("stale temporary files not removed", extra={"error": type(exc).__name__})


async def run_sweeper(settings: Settings, *, once: bool,
                      stop: asyncio.Event | None = None) -> SweepReport:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ValueError, NotImplementedError):  # not the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

    async def body(sweeper: Sweeper) -> SweepReport:
        await asyncio.to_thread(remove_stale_temporaries, sweeper.deleted.store)
        if once:
            return await sweeper.sweep_once()
        await sweeper.run(stop, interval_seconds=settings.sweep_interval_seconds)
        return SweepReport()

    report: SweepReport = await _with_sweeper(settings, body)
    return report


async def reconcile(settings: Settings, *, dry_run: bool, restore: bool = False,
                    delete_originals: bool = False, owner: str | None = None
                    ) -> ReconcileReport:
    async def body(sweeper: Sweeper) -> ReconcileReport:
        return await sweeper.reconcile.run(dry_run=dry_run, restore=restore,
                                           delete_originals=delete_originals, owner=owner)

    report: ReconcileReport = await _with_sweeper(settings, body)
    return report


def main(settings: Settings, *, once: bool) -> int:
    from darkroom import logs

    logs.setup()
    report = asyncio.run(run_sweeper(settings, once=once))
    if once:
        print(f"pending confirmed (upload found): {report.pending_confirmed}, "
              f"pending expired: {report.pending_expired}, "
              f"orphans deleted: {report.orphans_deleted}, files purged: "
              f"{report.files_purged}, events pruned: {report.events_pruned}, "
              f"idempotency keys pruned: {report.keys_pruned}")
    return 0


def reconcile_main(settings: Settings, *, dry_run: bool, restore: bool = False,
                   delete_originals: bool = False, owner: str | None = None) -> int:
    from darkroom import logs

    logs.setup()
    report = asyncio.run(reconcile(settings, dry_run=dry_run, restore=restore,
                                   delete_originals=delete_originals, owner=owner))
    def restored(item: str) -> str:
        parsed = parse_key(item.rpartition("@")[0])
        whence = ("named in its key" if parsed is not None and parsed.owner is not None
                  else "its key names no owner: --owner, or the one owner with API keys")
        return (("would restore " if dry_run else "restored ")
                + f"{item} for {report.restored[item]} ({whence})")

    for item in report.unaccounted:
        if item in report.restored:
            print(restored(item))
        elif item in report.kept:
            print(f"kept original {item}: {report.kept[item]}")
        else:
            print(("would delete " if dry_run else "deleted ") + item)
    # A restore picks the newest version of a key, which a page may not have listed.
    for item in report.restored:
        if item not in report.unaccounted:
            print(restored(item))
    verb = "unaccounted" if dry_run else "deleted"
    deleted = len(report.unaccounted) - len(report.kept) - len(
        [i for i in report.restored if i in report.unaccounted])
    print(f"objects examined: {report.examined}, originals kept: {len(report.kept)}, "
          f"restored: {len(report.restored)}, {verb}: "
          f"{deleted if dry_run else report.deleted}")
    return 0
