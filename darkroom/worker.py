"""The worker: N slots that claim leased cards, derive WebP in child processes, and publish.

One asyncio loop runs everything that waits (database, store, signals); the CPU work of a
decode runs in a child process per slot, so neither a slow image nor a crashing decoder
can stall heartbeats or take the worker down. The loop, in prose:

    while not stopping:
        claim as many cards as there are free slots;
        start a job for each;
        sleep until NOTIFY, a job finishing, or a jittered poll.

Each job: read the exact confirmed original, derive, PUT under a key unique to the
attempt, fenced commit. A separate heartbeat task extends every held lease each lease/3;
a lease found lost kills that job's child at once. On SIGTERM/SIGINT the worker stops
claiming, lets jobs finish within the grace period, then kills the rest and hands their
cards back; a second signal skips the grace. However the database answers, the stop ends
within the grace and STOP_MARGIN_SECONDS (stop.py): what does not answer in time is given
up.

Every database write may commit while its answer is lost. Each is safe to repeat and
recognized as its own success when repeated (see queue.py); a claim whose answer was lost
is looked up by the claim id the worker chose, and its leases are run, not left to
expire. Jobs are tracked by attempt (lease token), never by file: after an outage longer
than the lease a worker may reclaim its own card while the stale attempt still runs, and
only the new one may go on. An attempt's whole life is bounded by
DARKROOM_ATTEMPT_TIMEOUT_SECONDS.

Blame goes by origin. Only a file's own bytes (format, decode, limits, a decode past its
time) fail it. Every error on the way to or from the store is the store's: such an attempt
is handed back with its attempt given back (`defer`), and a store that does not serve a
canary pauses claiming (breaker.py) instead of spending the backlog's attempts. Only a
file the store fails while it serves others between the file's tries is counted against
the file (`defer_counted`), and rejected at DARKROOM_MAX_DEFERRALS.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NoReturn, Protocol, TypeVar

from darkroom import canary, health, metrics, signals
from darkroom.breaker import StoreBreaker
from darkroom.completer import Completer, Completions
from darkroom.config import ConfigError, Settings
from darkroom.db.database import CONNECTION_ERRORS, ROLLED_BACK, Database
from darkroom.derive import Limits
from darkroom.errors import (
    DeriveError,
    ErrorCode,
    ObjectMissing,
    StorageError,
    StorageUnavailable,
)
from darkroom.layout import derived_key, thumb_key
from darkroom.queue import (
    PAUSED_NOTICE,
    ClaimUnknown,
    Derived,
    DerivedObject,
    Lease,
    LeaseLost,
    Queue,
    Status,
    backoff_delay,
)
from darkroom.sandbox import DECODER, ChildProgram, DecoderProcess, jail_log_fields
from darkroom.services import prepare
from darkroom.stop import END_SECONDS, StopDeadline
from darkroom.storage import ObjectStore

log = logging.getLogger("darkroom.worker")
T = TypeVar("T")

# How long a worker spends handing leases back, or a stopping one waits for a claim on its
# way, at most (within the stop's deadline, stop.py).
HAND_BACK_SECONDS = 5.0
# A failed heartbeat is tried again this soon (doubling up to the heartbeat interval).
HEARTBEAT_RETRY_SECONDS = 0.2
# Files whose last deferral by this worker is remembered (to tell whether the store served
# others between their tries), at most.
REMEMBERED_DEFERRALS = 10_000


# The leases a worker holds at most, per slot: one decoding, one whose commit is on its way,
# one kept ahead.
HELD_PER_SLOT = 3


class Outcome(StrEnum):
    """How an attempt ended, as the worker's metrics and logs name it."""

    READY = "ready"
    RETRY = "retry"  # failed, queued again with a backoff
    REJECTED = "rejected"
    DEFERRED = "deferred"  # the store failed it: queued again, the attempt given back
    LEASE_LOST = "lease_lost"
    RELEASED = "released"  # handed back at shutdown
    ERROR = "error"  # crashed, or timed out without being recorded


class WorkerQueue(Completions, Protocol):
    """The queue calls a worker makes (`queue.Queue` answers them all): its seam, so that
    its decisions can be tried against a scripted queue."""

    async def claim(self, n: int) -> list[Lease]: ...
    async def adopt_claim(self, claim_id: uuid.UUID) -> list[Lease]: ...
    async def heartbeat(self, leases: Sequence[Lease]) -> set[uuid.UUID]: ...
    async def track_attempt_objects(self, lease: Lease, keys: Sequence[str]) -> None: ...
    async def fail(self, lease: Lease, code: ErrorCode) -> Status: ...
    async def defer(self, lease: Lease, code: ErrorCode, delay: float) -> None: ...
    async def defer_counted(self, lease: Lease, code: ErrorCode) -> tuple[Status, int]: ...
    async def release(self, leases: Sequence[Lease],
                      unstarted: Collection[uuid.UUID] = ()) -> set[uuid.UUID]: ...
    async def pause_worker(self, reason: str) -> None: ...
    async def resume_worker(self) -> None: ...
    def listen(self) -> AbstractAsyncContextManager[AsyncIterator[str]]: ...


@dataclass(eq=False)
class Job:
    lease: Lease
    # Its slot: the decoder it holds until its result is handed to the completer (None
    # from then on, while its commit is on its way).
    decoder: DecoderProcess | None
    started: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    # Set when the attempt must not touch the card any more: its lease was lost, or the
    # worker handed it back at shutdown.
    abandoned: bool = False
    # Until when (this process's monotonic clock) the lease surely holds: the send time of
    # the claim or of the last answered heartbeat, plus the lease. Its statements are
    # retried through a database fault until then.
    held_until: float = 0.0
    # The attempt's fenced commit, once handed to the completer: its answer, not a timeout
    # that raced it, tells how the attempt ended.
    commit: asyncio.Future[bool] | None = None
    # Set while the attempt waits on the object store (a read, a write, the probe after a
    # store error): a deadline that runs out then is the store's, not the file's.
    on_store: bool = False
    # The attempt's PUTs, by key: each runs on in its thread when the attempt gives up on
    # it, and may land in the store later still.
    puts: dict[str, asyncio.Future[str]] = field(default_factory=dict)

    def log_extra(self) -> dict[str, Any]:
        return {"file_id": str(self.lease.file_id), "attempt": self.lease.attempt,
                "token": self.lease.token_prefix}

    def abandon(self) -> None:
        self.abandoned = True
        if self.decoder is not None:
            self.decoder.kill()


class Worker:
    def __init__(
        self, settings: Settings, queue: WorkerQueue, store: ObjectStore, *,
        concurrency: int, child: ChildProgram = DECODER,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.store = store
        self.concurrency = concurrency
        limits = Limits.from_settings(settings)
        self.idle_decoders = [
            DecoderProcess(limits, timeout=settings.derive_timeout_seconds,
                           memory_mb=settings.derive_memory_mb, nice=settings.derive_nice,
                           program=child)
            for _ in range(concurrency)
        ]
        # By lease token: one entry per attempt, never per file.
        self.jobs: dict[uuid.UUID, Job] = {}
        # Probing backs off no further than a retry would (DARKROOM_RETRY_CAP_SECONDS, at
        # most 30 s): a store back is noticed as soon as a retried card would be.
        self.breaker = StoreBreaker(self._probe_store, on_change=self._record_pause,
                                    cap_seconds=settings.retry_cap_seconds)
        # Fenced commits, batched: one statement for the results that finish together,
        # sent with the claim of the slots they free.
        self.completer = Completer(queue, self._db_for_leases, refill=_Refill(self))
        # Leases claimed ahead of a free slot (with a batch's commit, or by a claim that
        # found more than the slots free), by token, each with until when it surely holds:
        # started as soon as a slot frees (heartbeated meanwhile). At most one per slot,
        # refilled once used up (claim_room): a slot that frees starts its next job at
        # once, without a claim's round trip, and the claims go with commits, one per
        # slots' worth of jobs.
        self.claimed_ahead: dict[uuid.UUID, tuple[Lease, float]] = {}
        # Cards being claimed right now (by the loop or with a batch's commit), so that
        # the two together never claim more than claim_room allows.
        self.claiming = 0
        # By file: when (monotonic) this worker last handed it back for the store.
        self._deferred_at: dict[uuid.UUID, float] = {}
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.skip_grace = asyncio.Event()
        # When the running jobs' grace ends and the whole stop must end; what it gave up.
        self.deadline = StopDeadline()
        self._rng = random.Random()
        # Claims whose answer was lost and whose lookup found nothing yet: the claim may
        # still commit (its statement was on its way, or still running on the server).
        # By claim id: until when to look again, and until when its leases surely hold.
        self._unknown_claims: dict[uuid.UUID, tuple[float, float]] = {}
        # Unpublished attempts' objects being tracked anew once their PUTs return.
        self._tracking: set[asyncio.Task[None]] = set()
        # Leases kept ahead being handed back (a pause, the store breaker).
        self._handing_back: set[asyncio.Task[set[uuid.UUID]]] = set()

    # --- the main loop -----------------------------------------------------------------

    async def run(self) -> None:
        for decoder in self.idle_decoders:
            decoder.start()
        helpers = [asyncio.create_task(self._listen(), name="listen"),
                   asyncio.create_task(self._heartbeat(), name="heartbeat"),
                   asyncio.create_task(self.breaker.run(), name="store-breaker"),
                   asyncio.create_task(self.completer.run(), name="completer")]
        claiming = asyncio.create_task(self._claim_loop(), name="claim-loop")
        try:
            await self._until_stopping(claiming)
        finally:
            if not claiming.done():
                self.deadline.give_up(claiming)
            self.deadline.within(self.settings.shutdown_grace_seconds)  # ended by an error
            await self._drain()
            await self._finish_tracking()
            for task in helpers:
                task.cancel()
            await self.deadline.settle(helpers)
            # A commit's claim answered after the drain took the leases kept ahead.
            await self._hand_back([], self._take_kept_ahead())
            await self.deadline.settle(self._handing_back)
            await self.deadline.end_given_up()
            for decoder in self.idle_decoders:
                decoder.close()

    async def _claim_loop(self) -> None:
        while not self.stopping.is_set():
            if self.breaker.is_open:
                await self._wait_for_store()
                continue
            claimed = await self._claim_free_slots()
            if claimed == 0 or not self.idle_decoders:
                await self._sleep_until_woken()

    async def _until_stopping(self, claiming: asyncio.Task[None]) -> None:
        """Claim until the stop. A claim on its way then is waited for as long as a
        hand-back, then given up: what it may have leased waits out its lease."""
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait([claiming, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not claiming.done():
            await asyncio.wait([claiming], timeout=self.deadline.left(HAND_BACK_SECONDS))
        if not claiming.done():
            log.warning("a claim on its way did not answer; what it leased will expire")
            return
        claiming.result()  # the loop's own error, if it ended with one

    def request_stop(self) -> None:
        """First signal: drain within the grace period. Second: skip the grace."""
        if self.stopping.is_set():
            log.warning("second signal: skipping the shutdown grace")
            self.skip_grace.set()
            self.deadline.within(0.0)
        else:
            log.info("stopping: no new claims; finishing running jobs",
                     extra={"running": len(self.jobs)})
            self.stopping.set()
            self.deadline.within(self.settings.shutdown_grace_seconds)
        self.wake.set()

    async def _claim_free_slots(self) -> int:
        adopted = await self._adopt_late_claims() if self._unknown_claims else 0
        adopted += self._start_claimed_ahead()
        free = self.room_to_claim()
        if free <= 0:
            return adopted
        sent = time.monotonic()
        held_until = sent + self.settings.lease_seconds
        self.claiming += free
        try:
            leases = await self.queue.claim(free)
        except ClaimUnknown as unknown:
            metrics.DB_ERRORS.inc()
            log.warning("claim's answer lost; looking up what it leased",
                        extra={"error": type(unknown.__cause__).__name__})
            claim_id = unknown.claim_id
            try:
                leases = await self._db(lambda: self.queue.adopt_claim(claim_id),
                                        lambda: held_until)
            except CONNECTION_ERRORS as exc:
                # Whatever it leased waits for its lease to expire: nothing is lost.
                log.warning("could not look up the claim; database unavailable",
                            extra={"error": type(exc).__name__})
                await self._pause(self._rng.uniform(0.5, 2.0))
                return 0
            metrics.CLAIMS_ADOPTED.inc(len(leases))
            if not leases:
                # Nothing yet; the claim may commit later. Looked up again at every turn
                # of the loop, so what it leases is run, not left to run out its lease.
                self._unknown_claims[claim_id] = (sent + 2 * self.settings.lease_seconds,
                                                  held_until)
        except CONNECTION_ERRORS as exc:
            metrics.DB_ERRORS.inc()
            log.warning("claim failed; database unavailable", extra={"error": type(exc).__name__})
            await self._pause(self._rng.uniform(0.5, 2.0))
            return 0
        finally:
            self.claiming -= free
        await self._take(leases, held_until)
        return len(leases)

    def room_to_claim(self) -> int:
        return claim_room(slots=self.concurrency, idle=len(self.idle_decoders),
                          jobs=len(self.jobs), kept=len(self.claimed_ahead),
                          claiming=self.claiming)

    async def _take(self, leases: list[Lease], held_until: float) -> int:
        """Start what fits the free slots, keep what fits ahead, and hand the rest back at
        once (due now) rather than let it wait for its lease. Answers the jobs started.
        Once stopping (a claim that answered during the stop), nothing is started or kept:
        all of it goes back unstarted, its attempt given back."""
        room = 0 if self.stopping.is_set() else len(self.idle_decoders)
        for lease in leases[:room]:
            self._start(lease, held_until)
        keep = max(min(self.concurrency - len(self.claimed_ahead), len(leases) - room), 0)
        if self.stopping.is_set():
            keep = 0
        for lease in leases[room:room + keep]:
            self.claimed_ahead[lease.token] = (lease, held_until)
        await self._hand_back([], leases[room + keep:])
        return min(room, len(leases))

    def _start_claimed_ahead(self) -> int:
        """Start the leases claimed ahead, as far as slots are free."""
        room = len(self.idle_decoders)
        started = 0
        for token in list(self.claimed_ahead)[:max(room, 0)]:
            lease, held_until = self.claimed_ahead.pop(token)
            self._start(lease, held_until)
            started += 1
        return started

    async def _adopt_late_claims(self) -> int:
        """Run what a claim whose answer was lost leased after its first lookup. A claim
        commits all its rows at once: once some are found, it is settled."""
        started = 0
        now = time.monotonic()
        for claim_id, (look_until, held_until) in list(self._unknown_claims.items()):
            if now > look_until:
                del self._unknown_claims[claim_id]
                continue
            try:
                leases = await self.queue.adopt_claim(claim_id)
            except CONNECTION_ERRORS as exc:
                metrics.DB_ERRORS.inc()
                log.warning("could not look up a claim; trying again",
                            extra={"error": type(exc).__name__})
                return started
            if not leases:
                continue
            del self._unknown_claims[claim_id]
            metrics.CLAIMS_ADOPTED.inc(len(leases))
            log.info("a lost claim committed late; running what it leased",
                     extra={"leases": len(leases)})
            # Its rows were claimed for slots free then (or with a batch's commit, for the
            # slots its jobs freed): as any claim's.
            started += await self._take(leases, held_until)
        return started

    def _start(self, lease: Lease, held_until: float) -> None:
        # After an outage longer than the lease this worker may have reclaimed a card its
        # own stale attempt still works on. That attempt's lease is gone: stop it, so
        # exactly one attempt runs for the card. (Its slot frees when its task ends.)
        for other in self.jobs.values():
            if other.lease.file_id == lease.file_id and not other.abandoned:
                log.warning("stale attempt of a reclaimed card; stopping it",
                            extra=other.log_extra())
                other.abandon()
        decoder = self.idle_decoders.pop(pick_decoder(self.idle_decoders, lease.owner))
        job = Job(lease, decoder, held_until=held_until)
        self.jobs[lease.token] = job
        job.task = asyncio.create_task(self._run_job(job), name=f"job-{lease.file_id}")
        metrics.CLAIMED.inc()
        log.info("claimed", extra=job.log_extra())

    async def _wait_for_store(self) -> None:
        """Claim nothing while the store breaker is open, until it closes or we stop; the
        leases kept ahead go back, for workers that can reach the store."""
        self._hand_back_kept_ahead("object store unavailable")
        closed = asyncio.create_task(self.breaker.wait_closed())
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait([closed, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            stopping.cancel()

    async def _sleep_until_woken(self) -> None:
        # Jittered, so that many idle workers do not poll in lock-step.
        timeout = self.settings.poll_seconds * self._rng.uniform(0.5, 1.5)
        await self._pause(timeout)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=seconds)
        self.wake.clear()

    # --- one attempt -------------------------------------------------------------------

    def _timeout_reserve(self) -> float:
        """Of the attempt timeout, the part kept for recording a timed-out attempt."""
        return min(30.0, self.settings.attempt_timeout_seconds / 4)

    async def _run_job(self, job: Job) -> None:
        outcome = Outcome.ERROR
        budget = self.settings.attempt_timeout_seconds - self._timeout_reserve()
        try:
            try:
                async with asyncio.timeout(budget):
                    outcome = await self._attempt(job)
            except TimeoutError:
                if job.on_store:
                    outcome = await self._store_timed_out(job)
                else:
                    outcome = await self._timed_out(job)
        except Exception:
            log.exception("attempt crashed", extra=job.log_extra())
        finally:
            if outcome != Outcome.READY and job.puts:
                self._track_late_writes(job)
            metrics.JOBS.labels(outcome).inc()
            metrics.JOB_SECONDS.labels(outcome).observe(time.monotonic() - job.started)
            del self.jobs[job.lease.token]
            self._free_slot(job)

    def _free_slot(self, job: Job) -> None:
        """The job's decoder goes back to the idle ones: a slot is free, so the loop
        starts a job claimed ahead or claims again at once, and a backlog drains."""
        if job.decoder is not None:
            self.idle_decoders.append(job.decoder)
            job.decoder = None
            self.wake.set()

    async def _timed_out(self, job: Job) -> Outcome:
        """The attempt outlived its time in the decoder or the database: give it up and
        queue the card again, within the reserve kept for that."""
        metrics.ATTEMPT_TIMEOUTS.inc()
        log.warning("attempt timed out; giving it up", extra=job.log_extra())
        if job.decoder is not None:
            job.decoder.kill()
        try:
            async with asyncio.timeout(self._timeout_reserve()):
                if job.commit is not None:
                    # Its commit is on its way: recording a failure now would race it (and
                    # lose to it, as a lost lease). Its answer says what happened.
                    if await asyncio.shield(job.commit):
                        return Outcome.READY
                    metrics.LEASE_LOST.inc()
                    return Outcome.LEASE_LOST
                return await self._fail(job, ErrorCode.PROCESSING_TIMEOUT, "attempt timeout")
        except (TimeoutError, *CONNECTION_ERRORS):
            # Unrecorded: the lease runs out and another attempt takes the card.
            return Outcome.ERROR

    async def _attempt(self, job: Job) -> Outcome:
        lease = job.lease
        try:
            with _stage("fetch"), self._on_store(job):
                original = await asyncio.to_thread(
                    self.store.get, lease.original_key, lease.original_version or "")
            if job.abandoned:
                return Outcome.LEASE_LOST
            decoder = job.decoder
            assert decoder is not None  # held until the commit
            with _stage("derive"):
                # Named, so that a child that saw another owner's image is replaced first.
                result = await asyncio.to_thread(decoder.derive, original, owner=lease.owner)
            # The decoder's own steps, inside "derive": where its wall time goes.
            for step, seconds in decoder.last_stages.items():
                metrics.STAGE_SECONDS.labels(f"derive_{step}").observe(seconds)
            if job.abandoned:
                return Outcome.LEASE_LOST
            # Both keys are accounted for by the database if the lease ends unpublished.
            key, small_key = derived_key(lease), thumb_key(lease)
            thumb = result.thumb
            with _stage("put"), self._on_store(job):
                version = await self._put(job, key, result.data)
                stored = None
                if thumb is not None:
                    thumb_version = await self._put(job, small_key, thumb.data)
                    stored = DerivedObject(key=small_key, version=thumb_version,
                                           sha256=thumb.sha256, width=thumb.width,
                                           height=thumb.height, size=thumb.size)
            derived = Derived(key=key, version=version, sha256=result.sha256,
                              width=result.width, height=result.height, size=result.size,
                              thumb=stored, thumbhash=result.thumbhash)
            with _stage("commit"):
                # The slot is free while the commit is on its way: the next job starts now
                # and its decode overlaps this commit.
                self._free_slot(job)
                job.commit = self.completer.submit(lease, derived)
                # Shielded: a timeout stops the wait, never the commit (see _timed_out).
                if not await asyncio.shield(job.commit):
                    raise LeaseLost(lease.file_id, lease.token)
            log.info("ready", extra={**job.log_extra(), "bytes": result.size})
            self._deferred_at.pop(lease.file_id, None)
            return Outcome.READY
        except LeaseLost:
            metrics.LEASE_LOST.inc()
            log.warning("lease lost; result not published", extra=job.log_extra())
            return Outcome.LEASE_LOST
        except ObjectMissing:
            job.on_store = False  # the store answered: this version is not there
            return await self._fail(job, ErrorCode.ORIGINAL_MISSING, "original missing")
        except StorageError as exc:
            return await self._store_failed(job, exc)
        except DeriveError as exc:
            if job.abandoned:
                return Outcome.LEASE_LOST
            return await self._fail(job, exc.code, exc.detail)

    async def _put(self, job: Job, key: str, data: bytes) -> str:
        """One derivative PUT, in a thread that runs on if the attempt gives up on it."""
        put = asyncio.ensure_future(
            asyncio.to_thread(self.store.put, key, data, content_type="image/webp"))
        job.puts[key] = put
        return await asyncio.shield(put)

    async def _finish_tracking(self) -> None:
        """At stop: let unpublished attempts' PUTs return and be tracked, within the
        shutdown grace; a second signal cuts it short. What is left untracked is
        reconcile's, as for a worker killed."""
        if not self._tracking:
            return
        tracked = asyncio.ensure_future(asyncio.wait(set(self._tracking)))
        skipped = asyncio.ensure_future(self.skip_grace.wait())
        try:
            await asyncio.wait([tracked, skipped],
                               timeout=self.deadline.left(self.settings.shutdown_grace_seconds),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            tracked.cancel()  # the wait, not the tasks it waits for
            skipped.cancel()
        for task in list(self._tracking):
            if not task.done():
                self.deadline.give_up(task)

    def _track_late_writes(self, job: Job) -> None:
        """An attempt that did not publish: once its PUTs have returned, its objects are
        tracked anew. A stalled or half-down store can land a write after the attempt
        timed out, after the sweeper deleted what was there and dropped the first row;
        without a row, that object would be kept for ever (until a reconcile)."""
        async def track() -> None:
            await asyncio.wait(job.puts.values())
            for put in job.puts.values():
                if not put.cancelled():
                    put.exception()  # retrieved: its failure was the attempt's to handle
            try:
                # Failed PUTs too: their client gave up on them, not necessarily the store.
                await self._db(lambda: self.queue.track_attempt_objects(
                    job.lease, list(job.puts)), lambda: 0.0)
            except Exception as exc:
                # The first row may still stand; if not, reconcile finds the object.
                log.warning("could not track an unpublished attempt's objects",
                            extra={**job.log_extra(), "error": type(exc).__name__},
                            exc_info=not isinstance(exc, CONNECTION_ERRORS))

        task = asyncio.create_task(track(), name=f"track-{job.lease.token_prefix}")
        self._tracking.add(task)
        task.add_done_callback(self._tracking.discard)

    async def _fail(self, job: Job, code: ErrorCode, detail: str) -> Outcome:
        if job.abandoned:
            return Outcome.LEASE_LOST
        try:
            status = await self._db(lambda: self.queue.fail(job.lease, code),
                                    lambda: job.held_until)
        except LeaseLost:
            metrics.LEASE_LOST.inc()
            log.warning("lease lost before the failure was recorded", extra=job.log_extra())
            return Outcome.LEASE_LOST
        if status == "queued":
            metrics.RETRIES.labels(str(code)).inc()
        log.info("attempt failed", extra={**job.log_extra(), "error_code": str(code),
                                          "status": status, "detail": detail[:300]})
        return Outcome.RETRY if status == "queued" else Outcome.REJECTED

    @contextlib.contextmanager
    def _on_store(self, job: Job) -> Iterator[None]:
        """Marks the attempt as waiting on the store; a request it completes proves the
        store served."""
        job.on_store = True
        yield
        job.on_store = False
        self.breaker.served()

    async def _store_failed(self, job: Job, exc: StorageError) -> Outcome:
        """A store error is the store's: the card goes back with its attempt given back.
        A store that does not serve the probe opens the breaker (no claims until it
        does); the deferral counts against the file only if the store served others
        since the file's last try."""
        if job.abandoned:
            return Outcome.LEASE_LOST
        job.on_store = True
        answers = await self.breaker.store_answers()
        job.on_store = False
        return await self._defer(job, type(exc).__name__, answers=answers)

    async def _store_timed_out(self, job: Job) -> Outcome:
        """The attempt's deadline ran out while it waited on the store: the store's fault.
        The breaker opens at once (a probe would only wait as long), and the card goes
        back within the reserve kept for that."""
        metrics.ATTEMPT_TIMEOUTS.inc()
        log.warning("attempt timed out waiting on the object store", extra=job.log_extra())
        self.breaker.trip("timeout")
        try:
            async with asyncio.timeout(self._timeout_reserve()):
                return await self._defer(job, "timeout", answers=False)
        except (TimeoutError, *CONNECTION_ERRORS):
            # Unrecorded: the lease runs out and another attempt takes the card.
            return Outcome.ERROR

    async def _defer(self, job: Job, error: str, *, answers: bool) -> Outcome:
        """Hand the card back, its attempt given back. Counted against the file when the
        store served right after its failure (the probe: it fails this file alone), or
        served anything (another file, a probe) between this file's last deferral here
        and this one: a file whose own request knocks the store over fails again once
        the store is back. An outage serves nothing between tries, and counts nothing."""
        if job.abandoned:
            return Outcome.LEASE_LOST
        lease = job.lease
        now = time.monotonic()
        last = self._deferred_at.get(lease.file_id)
        counted = answers or (last is not None and self.breaker.served_at > last)
        code = ErrorCode.STORAGE_UNAVAILABLE
        try:
            if counted:
                status, deferrals = await self._db(
                    lambda: self.queue.defer_counted(lease, code), lambda: job.held_until)
            else:
                delay = backoff_delay(1, self.settings.retry_base_seconds,
                                      self.settings.retry_cap_seconds, self._rng)
                await self._db(lambda: self.queue.defer(lease, code, delay),
                               lambda: job.held_until)
                status, deferrals = Status.QUEUED, None
        except LeaseLost:
            metrics.LEASE_LOST.inc()
            log.warning("lease lost before the deferral was recorded", extra=job.log_extra())
            return Outcome.LEASE_LOST
        metrics.DEFERRALS.labels("true" if counted else "false").inc()
        self._deferred_at.pop(lease.file_id, None)
        if status == Status.REJECTED:
            log.warning("the store failed this file while it served others, too often;"
                        " rejected", extra={**job.log_extra(), "error": error,
                                            "deferrals": deferrals})
            return Outcome.REJECTED
        self._deferred_at[lease.file_id] = now
        while len(self._deferred_at) > REMEMBERED_DEFERRALS:
            del self._deferred_at[next(iter(self._deferred_at))]
        log.info("store failed; card handed back, attempt given back",
                 extra={**job.log_extra(), "error": error, "deferrals": deferrals,
                        "breaker_open": self.breaker.is_open})
        return Outcome.DEFERRED

    async def _probe_store(self) -> None:
        """A canary round trip through the data path, bounded like an attempt's wait on
        the store (the store client's own timeouts apply to each request)."""
        try:
            async with asyncio.timeout(self.settings.attempt_timeout_seconds
                                       - self._timeout_reserve()):
                await asyncio.to_thread(canary.round_trip, self.store)
        except TimeoutError:
            raise StorageUnavailable("the object store did not answer the probe") from None

    async def _record_pause(self, paused: bool, reason: str) -> None:
        async with asyncio.timeout(10):
            if paused:
                await self.queue.pause_worker(reason)
            else:
                await self.queue.resume_worker()

    async def _db(self, call: Callable[[], Awaitable[T]], held_until: Callable[[], float]) -> T:
        """Retry a statement through a database fault while its lease may still hold.

        Every statement of the protocol is safe to repeat and recognizes a repeat of
        itself that went through (its answer lost) as success, so trying longer is never
        wrong, only slower to free the slot. A statement is tried for a lease's worth of
        time, and on for as long as `held_until` (read at each try) moves on with the
        heartbeats: a statement whose own connections keep being cut while the database
        answers the heartbeats does not cost its attempt. Past both, the lease may have
        gone to the next holder, and the fault is raised.
        """
        patience = time.monotonic() + self.settings.lease_seconds
        delay = 0.2
        while True:
            try:
                return await call()
            except CONNECTION_ERRORS as exc:
                metrics.DB_ERRORS.inc()
                if time.monotonic() + delay > max(patience, held_until()):
                    raise
                log.warning("database call failed; retrying",
                            extra={"error": type(exc).__name__, "retry_in": round(delay, 2)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _db_for_leases(self, call: Callable[[], Awaitable[T]],
                             leases: Sequence[Lease]) -> T:
        """`_db` for a statement of several attempts (the completer's batch): tried while
        any of their leases may hold, since each row is fenced by its own token."""
        def held_until() -> float:
            jobs = (self.jobs.get(lease.token) for lease in leases)
            return max((job.held_until for job in jobs if job is not None), default=0.0)

        return await self._db(call, held_until)

    # --- background tasks --------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = self.settings.lease_seconds / 3
        wait = interval
        retry = HEARTBEAT_RETRY_SECONDS
        while True:
            await asyncio.sleep(wait)
            wait = interval
            held = [job.lease for job in self.jobs.values() if not job.abandoned]
            held += [lease for lease, _ in self.claimed_ahead.values()]
            if not held:
                continue
            sent = time.monotonic()
            try:
                lost = await self.queue.heartbeat(held)
            except (*CONNECTION_ERRORS, *ROLLED_BACK) as exc:
                metrics.DB_ERRORS.inc()
                log.warning("heartbeat failed", extra={"error": type(exc).__name__})
                # One cut connection must not cost the leases: try again soon, backing off
                # to the interval while the database stays away.
                wait = min(interval, retry * self._rng.uniform(0.5, 1.5))
                retry = min(retry * 2, interval)
                continue
            retry = HEARTBEAT_RETRY_SECONDS
            metrics.HEARTBEATS.inc()
            for lease in held:
                ahead = self.claimed_ahead.get(lease.token)
                if ahead is not None:  # still waiting for its slot
                    if lease.token in lost:
                        metrics.LEASE_LOST.inc()
                        del self.claimed_ahead[lease.token]
                    else:
                        self.claimed_ahead[lease.token] = (
                            lease, max(ahead[1], sent + self.settings.lease_seconds))
                    continue
                # A job that ended while the heartbeat was in flight is gone from here.
                job = self.jobs.get(lease.token)
                if job is None:
                    continue
                if lease.token not in lost:
                    job.held_until = max(job.held_until, sent + self.settings.lease_seconds)
                elif not job.abandoned:
                    metrics.LEASE_LOST.inc()
                    log.warning("heartbeat: lease lost; stopping the job", extra=job.log_extra())
                    job.abandon()

    async def _listen(self) -> None:
        """LISTEN on a connection of its own: `notifies()` holds its connection."""
        delay = 0.5
        while True:
            try:
                async with self.queue.listen() as notifications:
                    delay = 0.5
                    self.wake.set()  # anything enqueued while we were not listening
                    async for payload in notifications:
                        if payload == PAUSED_NOTICE:
                            self._hand_back_kept_ahead("claiming paused")
                        self.wake.set()
            except CONNECTION_ERRORS as exc:
                log.warning("LISTEN connection lost; polling meanwhile",
                            extra={"error": type(exc).__name__})
                await asyncio.sleep(delay * self._rng.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)

    # --- shutdown ----------------------------------------------------------------------

    async def _drain(self) -> None:
        # The leases kept ahead go back first (due now, their attempt given back): no card
        # waits out this worker's grace unstarted.
        await self._hand_back([], self._take_kept_ahead())
        running = [job.task for job in self.jobs.values() if job.task is not None]
        if running:
            finished: asyncio.Future[Any] = asyncio.ensure_future(
                asyncio.gather(*running, return_exceptions=True))
            skipped: asyncio.Future[Any] = asyncio.create_task(self.skip_grace.wait())
            await asyncio.wait([finished, skipped],
                               timeout=self.deadline.grace_left(),
                               return_when=asyncio.FIRST_COMPLETED)
            skipped.cancel()
        unfinished = list(self.jobs.values())
        for job in unfinished:
            job.abandon()
        # With the unfinished, any lease a commit's claim kept ahead since.
        released = await self._hand_back(unfinished, self._take_kept_ahead())
        for job in unfinished:
            metrics.JOBS.labels(Outcome.RELEASED).inc()
            log.info("handed back" if job.lease.file_id in released else "not handed back",
                     extra=job.log_extra())
            if job.task is not None:
                job.task.cancel()
        await self.deadline.settle([job.task for job in unfinished if job.task is not None])

    def _hand_back_kept_ahead(self, why: str) -> None:
        """Hand the leases kept ahead back now (due now, their attempt given back), in a
        task of its own: cards this worker cannot or may not start go to the next claim."""
        if not self.claimed_ahead:
            return
        log.info("handing back the leases kept ahead",
                 extra={"leases": len(self.claimed_ahead), "reason": why})
        task = asyncio.create_task(self._hand_back([], self._take_kept_ahead()),
                                   name="hand-back-kept")
        self._handing_back.add(task)
        task.add_done_callback(self._handing_back.discard)

    def _take_kept_ahead(self) -> list[Lease]:
        kept = [lease for lease, _ in self.claimed_ahead.values()]
        self.claimed_ahead.clear()
        return kept

    async def _hand_back(self, unfinished: list[Job], unstarted: list[Lease]) -> set[uuid.UUID]:
        """Hand these leases back, within HAND_BACK_SECONDS and the stop's deadline;
        answers the ids released."""
        if not unfinished and not unstarted:
            return set()
        leases = [job.lease for job in unfinished] + unstarted
        tokens = {lease.token for lease in unstarted}
        # Sent again after a lost connection (a repeat that went through answers what it
        # did), so one cut connection does not leave the leases to expire.
        until = time.monotonic() + self.deadline.left(HAND_BACK_SECONDS)
        delay = 0.1
        while True:
            try:
                return await self.deadline.answer(until - time.monotonic(),
                                          self.queue.release(leases, tokens))
            except CONNECTION_ERRORS:
                if time.monotonic() + delay >= until:
                    break
                metrics.DB_ERRORS.inc()
                await asyncio.sleep(delay)
                delay *= 2
            except TimeoutError:
                break
        log.warning("could not hand leases back; they will expire instead")
        return set()


class _Refill:
    """The worker's side of claiming with a batch's commit (completer.Refill): the free
    slots and the leases kept ahead, less what is already held or claimed for them; none
    while the worker stops, its store breaker is open, or a claim's answer is still being
    looked for."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def wanted(self, finishing: int) -> int:
        w = self.worker
        if w.stopping.is_set() or w.breaker.is_open or w._unknown_claims:
            return 0
        # The batch's jobs freed their slots when they handed their results over.
        n = max(0, w.room_to_claim())
        w.claiming += n
        return n

    def claimed(self, leases: list[Lease], asked: int, sent: float) -> None:
        w = self.worker
        w.claiming -= asked
        held_until = sent + w.settings.lease_seconds
        for lease in leases:
            w.claimed_ahead[lease.token] = (lease, held_until)
        if leases:
            w.wake.set()

    def unknown(self, claim_id: uuid.UUID, asked: int, sent: float) -> None:
        w = self.worker
        w.claiming -= asked
        metrics.DB_ERRORS.inc()
        log.warning("the answer of a commit with a claim was lost; committing again and"
                    " looking up what the claim leased")
        # Looked up at the loop's next turn, as any claim whose answer was lost.
        w._unknown_claims[claim_id] = (sent + 2 * w.settings.lease_seconds,
                                       sent + w.settings.lease_seconds)
        w.wake.set()


def claim_room(*, slots: int, idle: int, jobs: int, kept: int, claiming: int) -> int:
    """How many cards a worker claims now. A slot that frees starts one of the leases kept
    ahead (`Worker.claimed_ahead`); only once none is kept, and none is being claimed, does
    one claim take a card for each idle slot and a slot's worth to keep ahead. So a slot
    never waits for a claim's round trip, and a worker of n slots claims once per n jobs,
    with a commit, not once per job. All it holds (its jobs, decoding or with their commit
    on its way, and the leases kept ahead or being claimed) stays within HELD_PER_SLOT per
    slot, so a database slow to commit never makes it hoard cards."""
    if kept or claiming:
        return 0
    return max(0, min(idle + slots, HELD_PER_SLOT * slots - jobs))


def pick_decoder(idle: list[DecoderProcess], owner: str) -> int:
    """Which idle decoder takes a job of `owner`: one whose child already holds only this
    owner's images, else one with no child, else any. A child never serves two owners
    (`DecoderProcess.derive` replaces it), so reusing a matching one saves a start-up."""
    owners = [decoder.owner for decoder in idle]
    for wanted in (owner, None):
        if wanted in owners:
            return len(owners) - 1 - owners[::-1].index(wanted)
    return len(idle) - 1


class _stage:
    """Times one stage of an attempt into the stage histogram."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        metrics.STAGE_SECONDS.labels(self.name).observe(time.monotonic() - self.start)


async def run_worker(settings: Settings, *, concurrency: int, name: str,
                     pulse: health.LoopPulse | None = None,
                     child: ChildProgram = DECODER,
                     stopped_early: Callable[[], bool] = lambda: False) -> None:
    """Run one worker until SIGTERM/SIGINT.

    A signal while it starts (checking the database and the store, opening its pool) ends
    it there, exit 0, nothing claimed; `stopped_early` says whether one came before this
    was called (`main` notes them from its first line)."""
    loop = asyncio.get_running_loop()
    early = asyncio.Event()
    worker: Worker | None = None

    def on_signal() -> None:
        # Whatever the worker's state when the signal's turn on the loop comes.
        if worker is not None:
            worker.request_stop()
        else:
            early.set()

    # The loop's handlers first, then what came before them: no signal falls between.
    _on_signals(loop, on_signal)
    if stopped_early():
        early.set()
    starting = asyncio.create_task(_open(settings, name), name="start")
    signalled = asyncio.create_task(early.wait())
    await asyncio.wait([starting, signalled], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    if not starting.done():
        starting.cancel()
        await asyncio.wait([starting], timeout=END_SECONDS)
        log.info("stopped before the worker started", extra={"worker": name})
        return
    db, store = starting.result()
    queue = Queue.from_settings(db, settings, worker=name)
    worker = Worker(settings, queue, store, concurrency=concurrency, child=child)
    if early.is_set():
        worker.request_stop()
    ticking = asyncio.create_task(pulse.run(), name="pulse") if pulse else None
    try:
        # Once, at start: exactly which of the decoder jail's protections this host allows.
        level, fields = await asyncio.to_thread(jail_log_fields, settings.derive_memory_mb)
        log.log(level, "decoder jail", extra={"worker": name, **fields})
        log.info("worker started", extra={"worker": name, "slots": concurrency})
        await worker.run()
    finally:
        if ticking:
            ticking.cancel()
        # Within the stop's margin: the pool's connections being opened are not waited for.
        await db.close(timeout=END_SECONDS)
        log.info("worker stopped", extra={"worker": name})


async def _open(settings: Settings, name: str) -> tuple[Database, ObjectStore]:
    conninfo, store = await prepare(settings)
    db = await Database.open(conninfo, min_size=1, max_size=4, name=f"worker-{name}",
                             generic_plans=True)
    return db, store


def _on_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):  # not main
        for sig in signals.STOPPING:
            loop.add_signal_handler(sig, handler)


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def main(settings: Settings, *, concurrency: int | None, name: str | None,
         metrics_port: int | None, metrics_host: str = "127.0.0.1",
         child: ChildProgram = DECODER) -> int:
    """The `worker` command: one worker process, until SIGTERM/SIGINT; exit 0."""
    from darkroom import logs

    # A signal before the loop runs is noted, not fatal: the worker stops at once. Held
    # already since `darkroom`'s first line (signals.py), or from here.
    signals.hold()
    logs.setup()
    slots = concurrency or os.cpu_count() or 1
    if slots < 1:
        raise ConfigError("--concurrency must be at least 1")
    pulse = health.LoopPulse()
    if metrics_port is not None:
        try:
            health.serve(metrics_host, metrics_port, pulse)
        except OSError as exc:
            raise ConfigError(f"--metrics-port: cannot listen on {metrics_host}:"
                              f"{metrics_port} ({exc.strerror})") from None
    # Never closed: closing it would put the default handlers back, and a signal then
    # would kill the stopped worker (the process ends below, without the interpreter's
    # shutdown, which would do the same).
    loop = asyncio.new_event_loop()
    threads = ThreadPoolExecutor(thread_name_prefix="worker")  # the loop's to_thread
    loop.set_default_executor(threads)
    loop.run_until_complete(run_worker(
        settings, concurrency=slots, name=name or default_name(), pulse=pulse,
        child=child, stopped_early=lambda: bool(signals.held)))
    _end_leftovers(loop)
    threads.shutdown(wait=False, cancel_futures=True)  # an idle thread ends at once
    _exit_now()


def _end_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does after its main task, bounded: the tasks still pending (a
    pool's connection being opened) are cancelled and given END_SECONDS."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=END_SECONDS))
    loop.run_until_complete(loop.shutdown_asyncgens())


def _exit_now() -> NoReturn:
    """The stop is over: the process ends here, exit 0, with its logs flushed and its exit
    functions run, and without the interpreter's shutdown. That shutdown puts the default
    handlers of SIGTERM and SIGINT back some 60 ms before the process is gone (a signal
    then would kill a worker whose stop is done), and waits for every thread: one still
    blocked on a store or a database that does not answer (a download, the store's probe,
    the start's checks) would hold the exit until the call times out. Such a call is
    abandoned, as a kill would; what it may still land is the sweeper's (the attempt's
    objects were registered by its claim)."""
    others = [t for t in threading.enumerate()
              if t is not threading.current_thread() and not t.daemon]
    until = time.monotonic() + END_SECONDS
    for thread in others:
        thread.join(max(0.0, until - time.monotonic()))
    stuck = [t for t in others if t.is_alive()]
    if stuck:
        log.warning("exiting without waiting for calls that did not answer",
                    extra={"threads": len(stuck)})
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
