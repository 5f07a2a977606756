"""The worker's own bookkeeping, in-process against a real database, store and decoders."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from darkroom.config import Settings
from darkroom.db.database import Database
from darkroom.queue import Queue, claim_params
from darkroom.reads import Reads
from darkroom.storage import open_store
from darkroom.worker import Worker
from tests.support.services import confirm, small_photos
from tests.support.sql import SQL


async def test_reclaiming_its_own_card_runs_one_attempt_and_keeps_the_slots(
        pool: Any, db_url: str, tmp_path: Path) -> None:
    """After an outage longer than the lease a worker can claim, again, a card its own
    stale attempt still holds in memory. Only the new attempt may go on, both slots come
    back, and nothing crashes (jobs are tracked by attempt, not by file)."""
    store = open_store((tmp_path / "objects").as_uri())
    settings = Settings(lease_seconds=30, retry_base_seconds=0, data_dir=tmp_path)
    queue = Queue.from_settings(Database(pool), settings, worker="w")
    [data] = small_photos(1)
    card = await queue.create_file(owner="o", filename="a.jpg", content_type="image/jpeg",
                                   size=len(data))
    version = await asyncio.to_thread(store.put, card.original_key, data)
    await confirm(queue, card.id, "o", version)
    [stale] = await queue.claim(1)
    with psycopg.connect(db_url, autocommit=True) as conn:  # the outage outlived the lease
        conn.execute(SQL["expire_every_lease"])
    [fresh] = await queue.claim(1)
    assert fresh.file_id == stale.file_id and fresh.attempt == 2

    worker = Worker(settings, queue, store, concurrency=2)
    for decoder in worker.idle_decoders:
        decoder.start()
    completer = asyncio.create_task(worker.completer.run())
    try:
        held_until = time.monotonic() + settings.lease_seconds
        worker._start(stale, held_until)
        worker._start(fresh, held_until)
        assert len(worker.jobs) == 2 and worker.jobs[stale.token].abandoned
        await asyncio.gather(*(job.task for job in list(worker.jobs.values())
                               if job.task is not None))
        assert worker.jobs == {} and len(worker.idle_decoders) == 2
        leases = await queue.claim(2)
        assert leases == []
        row = await Reads(queue.db).get_file(card.id, "o")
        assert row is not None and row.status == "ready" and row.attempts == 2
        assert row.derived_key is not None and str(fresh.token) in row.derived_key
        kinds = [e.kind for e in await Reads(queue.db).events(fresh.file_id)]
        assert kinds == ["claimed", "claimed", "ready"]
    finally:
        completer.cancel()
        for decoder in worker.idle_decoders:
            decoder.close()


async def test_a_statement_is_tried_while_the_heartbeats_hold_its_lease(
        pool: Any, tmp_path: Path) -> None:
    """A statement whose own connections keep being cut is tried again for as long as the
    lease is known to hold, past a lease's worth of trying; once the lease may be gone,
    the fault is raised (the statement is fenced, so only a slot is at stake)."""
    store = open_store((tmp_path / "objects").as_uri())
    settings = Settings(lease_seconds=0.5, data_dir=tmp_path)
    worker = Worker(settings, Queue.from_settings(Database(pool), settings, worker="w"),
                    store, concurrency=1)
    tries = 0

    async def cut_three_times() -> str:
        nonlocal tries
        tries += 1
        if tries <= 3:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return "committed"

    # Heartbeats get through: the lease keeps holding.
    assert await worker._db(cut_three_times, lambda: time.monotonic() + 10) == "committed"
    assert tries == 4

    # No heartbeat since the lease ran out: a lease's worth of trying, then the fault.
    tries = 0
    with pytest.raises(psycopg.OperationalError):
        await worker._db(cut_three_times, lambda: 0.0)
    assert 1 <= tries <= 3


async def test_a_timeout_racing_the_attempts_own_commit_records_no_lost_lease(
        pool: Any, db_url: str, tmp_path: Path) -> None:
    """The attempt's commit waits (its row is locked by another transaction) when the
    attempt timeout fires. The commit goes through once the lock is gone, within the
    timeout's reserve: the attempt is published and nothing records a lost lease."""
    from prometheus_client import REGISTRY

    from tests.support.services import wait_for

    store = open_store((tmp_path / "objects").as_uri())
    # The budget is 6 s of 8, the reserve 2 s.
    settings = Settings(lease_seconds=30, attempt_timeout_seconds=8, data_dir=tmp_path)
    queue = Queue.from_settings(Database(pool), settings, worker="w")
    [data] = small_photos(1)
    card = await queue.create_file(owner="o", filename="a.jpg", content_type="image/jpeg",
                                   size=len(data))
    version = await asyncio.to_thread(store.put, card.original_key, data)
    await confirm(queue, card.id, "o", version)
    [lease] = await queue.claim(1)

    def timeouts() -> float:
        return REGISTRY.get_sample_value("darkroom_attempt_timeouts_total") or 0.0

    def commit_waits() -> bool:
        with psycopg.connect(db_url) as conn:
            row = conn.execute(SQL["lock_waiters_on"], {"text": "unnest"}).fetchone()
        return row is not None and row[0] > 0

    before = timeouts()
    worker = Worker(settings, queue, store, concurrency=1)
    for decoder in worker.idle_decoders:
        decoder.start()
    completer = asyncio.create_task(worker.completer.run())
    locker: psycopg.Connection[Any] = await asyncio.to_thread(psycopg.connect, db_url)
    try:
        await asyncio.to_thread(locker.execute, SQL["lock_card"], {"id": card.id})
        worker._start(lease, time.monotonic() + settings.lease_seconds)
        job = worker.jobs[lease.token]
        await asyncio.to_thread(wait_for, commit_waits, timeout=30, what="the commit to wait")
        await asyncio.to_thread(wait_for, lambda: timeouts() > before, timeout=30,
                                what="the attempt timeout")
        await asyncio.to_thread(locker.rollback)
        assert job.task is not None
        await asyncio.wait_for(job.task, 30)
    finally:
        locker.close()
        completer.cancel()
        for decoder in worker.idle_decoders:
            decoder.close()
    row = await Reads(queue.db).get_file(card.id, "o")
    assert row is not None and row.status == "ready"
    assert row.derived_key is not None and str(lease.token) in row.derived_key
    kinds = [e.kind for e in await Reads(queue.db).events(card.id)]
    assert kinds == ["claimed", "ready"]


async def test_a_lost_claim_that_commits_after_its_lookup_is_still_adopted(
        pool: Any, db_url: str, tmp_path: Path) -> None:
    """A claim's answer is lost while its transaction is still open on the server; the
    worker's lookup finds nothing, then the claim commits. Its lease is run at the next
    turn of the worker's loop, not left to run out (30 s here)."""
    import uuid

    from darkroom.db.queries import QUERIES
    from darkroom.queue import ClaimUnknown, Lease
    from tests.support.services import wait_for

    store = open_store((tmp_path / "objects").as_uri())
    settings = Settings(lease_seconds=30, poll_seconds=0.2, data_dir=tmp_path)
    late = psycopg.connect(db_url)  # the claim's own connection, its commit delayed
    lookups: list[int] = []

    class LateClaim(Queue):
        """The network of this test: the first claim reaches the server, its answer
        never comes back, and it commits only when the test says so."""

        async def claim(self, n: int) -> list[Lease]:
            if lookups:
                return await super().claim(n)
            claim_id = uuid.uuid4()
            await asyncio.to_thread(late.execute, QUERIES["claim"], claim_params(
                n=n, max_attempts=self.max_attempts, claim=claim_id,
                lease_seconds=self.lease_seconds, worker=self.worker,
                bulk_share=self.bulk_share))
            raise ClaimUnknown(claim_id)

        async def adopt_claim(self, claim_id: uuid.UUID) -> list[Lease]:
            found = await super().adopt_claim(claim_id)
            lookups.append(len(found))
            return found

    queue = LateClaim.from_settings(Database(pool), settings, worker="w")
    [data] = small_photos(1)
    card = await queue.create_file(owner="o", filename="a.jpg", content_type="image/jpeg",
                                   size=len(data))
    version = await asyncio.to_thread(store.put, card.original_key, data)
    await confirm(queue, card.id, "o", version)
    worker = Worker(settings, queue, store, concurrency=1)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_for, lambda: bool(lookups), timeout=30,
                                what="the first lookup of the lost claim")
        assert lookups[0] == 0  # not committed yet: nothing to adopt
        await asyncio.to_thread(late.commit)

        async def ready() -> bool:
            row = await Reads(queue.db).get_file(card.id, "o")
            return row is not None and row.status == "ready"

        deadline = time.monotonic() + 20
        while not await ready():
            assert time.monotonic() < deadline, "the late claim's lease was not run"
            await asyncio.sleep(0.1)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        late.close()
    row = await Reads(queue.db).get_file(card.id, "o")
    assert row is not None and row.attempts == 1
    kinds = [e.kind for e in await Reads(queue.db).events(card.id)]
    assert kinds == ["claimed", "ready"]
    assert lookups[-1] == 1
