"""The completer: a worker's fenced commits, batched into one statement each.

Jobs hand their result to the completer and wait for its answer. While one batch is being
committed, the results that arrive meanwhile gather into the next, so an idle worker
commits at once and a busy one commits many jobs per round trip; a batch that is full
goes at once beside one in flight (the database commits both, on two connections).
Each row of a batch is still fenced by its own token (`Queue.complete_many`): a lost
lease is lost for that row alone, and a batch repeated after its answer was lost is
recognized row by row.

A batch being tried again through a database fault does not hold up the results that
finish meanwhile: they are committed as batches of their own, so one batch's cut
connections never keep other jobs waiting past their leases.

With a `Refill`, the room a batch leaves is claimed by the batch's own transaction
(`Queue.complete_and_claim`: one round trip, one commit), and the leases are handed over
before the batch's jobs hear their answers, so a busy worker's next jobs start without a
claim of their own; a claim that committed is handed over even when a stop or an error
cuts the commits it left short. A batch whose answer was lost is repeated as commits
alone, and its claim is left to be looked up (`Queue.adopt_claim`); any other error is
followed by the commits alone, so a claim's trouble never fails a finished job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import psycopg

from darkroom.queue import ClaimUnknown, Derived, Lease

log = logging.getLogger("darkroom.completer")

T = TypeVar("T")
# How a batch's statement is tried: the call, and the leases it commits (the worker retries
# it through a database fault while any of them may still hold).
Retry = Callable[[Callable[[], Awaitable[T]], Sequence[Lease]], Awaitable[T]]

# Results per statement at most. A statement's fixed cost is shared by its rows: at four
# busy worker processes of 128 slots, 200 rather than 100 cut the CPU per job by about a
# tenth (worker and database: 63 to 56 µs), and 400 gained nothing more.
MAX_BATCH = 200
# Batches in flight at most when the next is sent at once because it is full (the
# worker's pool holds four connections, shared with its heartbeats and claims).
FULL_BATCHES_IN_FLIGHT = 2
# How long the next batch waits for one in flight before it is committed beside it: a
# statement's time when the database answers, far less than any lease.
GATHER_SECONDS = 0.5


class Completions(Protocol):
    """The queue calls the completer makes: `Queue.complete_many`, and
    `Queue.complete_and_claim` when the worker claims with a batch's commit."""

    async def complete_many(self, results: Sequence[tuple[Lease, Derived]]
                            ) -> set[uuid.UUID]: ...

    async def complete_and_claim(self, results: Sequence[tuple[Lease, Derived]], n: int,
                                 claim_id: uuid.UUID | None = None, *,
                                 claimed: Callable[[list[Lease]], None] | None = None,
                                 ) -> tuple[set[uuid.UUID], list[Lease]]: ...


class Refill(Protocol):
    """The worker's side of claiming with a batch's commit."""

    def wanted(self, finishing: int) -> int:
        """How many cards to claim with a batch of `finishing` results (0: none)."""

    def claimed(self, leases: list[Lease], asked: int, sent: float) -> None:
        """The claim of `asked` sent at `sent` (monotonic) leased these (maybe none).
        Called before the batch's jobs hear their answers."""

    def unknown(self, claim_id: uuid.UUID, asked: int, sent: float) -> None:
        """The claim's answer was lost: it may have leased cards (`Queue.adopt_claim`)."""


class Completer:
    def __init__(self, queue: Completions, retry: Retry[set[uuid.UUID]], *,
                 max_batch: int = MAX_BATCH, refill: Refill | None = None,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        self.queue = queue
        self._retry = retry
        self.max_batch = max_batch
        self.gather_seconds = gather_seconds
        self._refill = refill
        self._pending: list[tuple[Lease, Derived, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        # Batches being committed: one at a time while they go through at once, more
        # while one is being tried again.
        self._committing: set[asyncio.Task[None]] = set()
        self._settled = asyncio.Event()

    def submit(self, lease: Lease, derived: Derived) -> asyncio.Future[bool]:
        """Hand one result over; the future answers True if published, False if the lease
        was lost. It is the commit's own: cancelling a wait on it (shielded) does not
        cancel the commit, whose answer still tells how the attempt ended."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((lease, derived, answer))
        self._wake.set()
        return answer

    async def complete(self, lease: Lease, derived: Derived) -> bool:
        """Publish one result; True if published, False if the lease was lost."""
        return await self.submit(lease, derived)

    async def run(self) -> None:
        """Commit what is pending, batch after batch, until cancelled."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    # Results gather while a batch is in flight; one still in flight after
                    # a statement's time is being tried again, and the next goes beside it.
                    # A full batch gains nothing by waiting: it goes at once beside one in
                    # flight, and the database commits both on two connections; never more
                    # at once, so the worker's heartbeats always find a connection.
                    if (len(self._pending) < self.max_batch
                            or len(self._committing) >= FULL_BATCHES_IN_FLIGHT):
                        await self._one_settles()
                    batch = self._pending[:self.max_batch]
                    del self._pending[:self.max_batch]
                    task = asyncio.create_task(self._commit(batch), name="complete-batch")
                    self._committing.add(task)
                    task.add_done_callback(self._done)
        finally:
            batches = list(self._committing)
            for task in batches:
                task.cancel()
            for *_, answer in self._pending:
                answer.cancel()
            # The batches end before the completer does: a claim one of them committed is
            # handed to the refill first, so a stopping worker hands its leases back in
            # its last hand-back instead of leaving them to wait out their lease.
            await asyncio.gather(*batches, return_exceptions=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._committing.discard(task)
        self._settled.set()

    async def _one_settles(self) -> None:
        """Wait for a batch in flight to settle, at most `gather_seconds`."""
        self._settled.clear()
        if not self._committing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), self.gather_seconds)

    async def _commit(self, batch: list[tuple[Lease, Derived, asyncio.Future[bool]]]) -> None:
        results = [(lease, derived) for lease, derived, _ in batch]
        try:
            lost = await self._commit_and_claim(results)
            if lost is None:
                lost = await self._retry(lambda: self.queue.complete_many(results),
                                         [lease for lease, _ in results])
        except asyncio.CancelledError:
            for *_, answer in batch:
                answer.cancel()
            raise
        except Exception as exc:
            for *_, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for lease, _, answer in batch:
            if not answer.done():  # its job may have been cancelled meanwhile
                answer.set_result(lease.token not in lost)


    async def _commit_and_claim(self, results: list[tuple[Lease, Derived]]
                                ) -> set[uuid.UUID] | None:
        """The batch's commits with the claim of the room it leaves; None when the commits
        are still to be made (or repeated) on their own."""
        asked = self._refill.wanted(len(results)) if self._refill else 0
        if self._refill is None or asked <= 0:
            return None
        refill = self._refill
        sent = time.monotonic()
        committed: list[Lease] = []

        def claimed(leases: list[Lease]) -> None:
            # The claim committed; the rows the batch left are still to be committed.
            # Its leases reach the worker once those are: until then the claim still
            # counts as in flight, so the worker's own claims (which rescue expired
            # leases) do not take a row of this batch from under its commit.
            committed.extend(leases)

        try:
            lost, leases = await self.queue.complete_and_claim(results, asked, claimed=claimed)
        except ClaimUnknown as unknown:
            refill.unknown(unknown.claim_id, asked, sent)
            return None
        except psycopg.Error as exc:
            # The pair rolled back whole, or the claim committed and the rows it left
            # failed: either way the commits go again alone, and the claim's leases (if
            # it committed) are the worker's.
            log.warning("commit with a claim failed; committing alone",
                        extra={"error": type(exc).__name__})
            refill.claimed(committed, asked, sent)
            return None
        except asyncio.CancelledError:
            # Stopping: a claim that committed is handed over (the worker hands its
            # leases back); one not yet answered runs out its lease.
            refill.claimed(committed, asked, sent)
            raise
        refill.claimed(leases, asked, sent)
        return lost


@contextlib.asynccontextmanager
async def running(completer: Completer) -> AsyncIterator[Completer]:
    """The completer's task for the length of a block."""
    task = asyncio.create_task(completer.run(), name="completer")
    try:
        yield completer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
