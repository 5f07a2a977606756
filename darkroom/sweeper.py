"""The sweeper: deferred clean-up of bytes that no card will ever show.

Two duties, each after a guard interval (so a reader of a just-issued presigned URL, or
an attempt still finishing its PUT, is not cut off):
- orphans: derivative objects written by attempts that never published (lease lost,
  crashed between PUT and commit, revoked) are deleted, every version;
- deleted files: every version of the original and of every derivative goes, then the
  card itself.
It also prunes old events, so the event log stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from dataclasses import dataclass

from darkroom.config import Settings
from darkroom.db.connection import open_pool
from darkroom.db.queries import QUERIES
from darkroom.errors import StorageUnavailable
from darkroom.queue import Queue
from darkroom.services import prepare
from darkroom.storage import LocalStore, ObjectStore

log = logging.getLogger("darkroom.sweeper")
BATCH = 100


@dataclass
class SweepReport:
    orphans_deleted: int = 0
    files_purged: int = 0
    events_pruned: int = 0

    def __bool__(self) -> bool:
        return bool(self.orphans_deleted or self.files_purged or self.events_pruned)


class Sweeper:
    def __init__(self, queue: Queue, store: ObjectStore, *,
                 guard_seconds: float, retention_seconds: float) -> None:
        self.queue = queue
        self.pool = queue.pool
        self.store = store
        self.guard_seconds = guard_seconds
        self.retention_seconds = retention_seconds

    async def sweep_once(self) -> SweepReport:
        """One full pass: every batch until nothing is due."""
        report = SweepReport()
        while (n := await self._orphan_batch()) > 0:
            report.orphans_deleted += n
        while (n := await self.queue.purge_deleted(
                guard_seconds=self.guard_seconds, limit=BATCH,
                delete_bytes=self._delete_file_objects)) > 0:
            report.files_purged += n
        report.events_pruned = await self._prune_events()
        return report

    async def _orphan_batch(self) -> int:
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(QUERIES["sweep_take_orphans"],
                                     {"guard_seconds": self.guard_seconds, "limit": BATCH})
            rows = await cur.fetchall()
            for row in rows:
                await asyncio.to_thread(self.store.delete, row["object_key"])
                await conn.execute(QUERIES["sweep_drop_orphan"], {"key": row["object_key"]})
                log.info("orphan deleted", extra={"file_id": str(row["file_id"]),
                                                  "token": str(row["token"])[:8],
                                                  "reason": row["reason"]})
            return len(rows)

    async def _delete_file_objects(self, file_id: uuid.UUID, original_key: str) -> None:
        def delete() -> None:
            self.store.delete(original_key)
            for obj in list(self.store.list(f"derived/{file_id}/")):
                self.store.delete(obj.key, obj.version)

        await asyncio.to_thread(delete)
        log.info("file purged", extra={"file_id": str(file_id)})

    async def _prune_events(self) -> int:
        total = 0
        while True:
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["sweep_prune_events"], {
                    "retention_seconds": self.retention_seconds, "limit": 5_000})
            pruned = int(cur.rowcount)
            total += pruned
            if pruned < 5_000:
                return total


async def expire_pending(queue: Queue, ttl_seconds: float) -> int:
    """Unconfirmed cards past `DARKROOM_PENDING_TTL_SECONDS` become deleted cards; the
    purge of deleted cards then removes their bytes. Answers how many expired."""
    total = 0
    while ids := await queue.expire_pending(ttl_seconds=ttl_seconds, limit=BATCH):
        total += len(ids)
        for file_id in ids:
            log.info("pending card expired", extra={"file_id": str(file_id)})
    return total


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
    conninfo, store = await prepare(settings)
    pool = await open_pool(conninfo, min_size=1, max_size=2, name="sweeper")
    sweeper = Sweeper(Queue.from_settings(pool, settings, worker="sweeper"), store,
                      guard_seconds=settings.sweep_guard_seconds,
                      retention_seconds=settings.event_retention_days * 86_400)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ValueError, NotImplementedError):  # not the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await asyncio.to_thread(remove_stale_temporaries, store)
    total = SweepReport()
    try:
        while True:
            try:
                await expire_pending(sweeper.queue, settings.pending_ttl_seconds)
                report = await sweeper.sweep_once()
            except (StorageUnavailable, OSError) as exc:
                log.warning("sweep interrupted; the next pass finishes it",
                            extra={"error": type(exc).__name__})
                report = SweepReport()
            total.orphans_deleted += report.orphans_deleted
            total.files_purged += report.files_purged
            total.events_pruned += report.events_pruned
            if report:
                log.info("sweep", extra=vars(report))
            if once:
                return total
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.sweep_interval_seconds)
            if stop.is_set():
                return total
    finally:
        await pool.close()


def main(settings: Settings, *, once: bool) -> int:
    from darkroom import logs

    logs.setup()
    report = asyncio.run(run_sweeper(settings, once=once))
    if once:
        print(f"orphans deleted: {report.orphans_deleted}, files purged: "
              f"{report.files_purged}, events pruned: {report.events_pruned}")
    return 0
