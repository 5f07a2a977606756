"""The completer: a worker's fenced commits, batched into one statement each.

Jobs hand their result to the completer and wait for its answer. While one batch is being
committed, the results that arrive meanwhile gather into the next, so an idle worker
commits at once and a busy one commits many jobs per round trip. Each row of a batch is
still fenced by its own token (`Queue.complete_many`): a lost lease is lost for that row
alone, and a batch repeated after its answer was lost is recognized row by row.

A batch being tried again through a database fault does not hold up the results that
finish meanwhile: they are committed as batches of their own, so one batch's cut
connections never keep other jobs waiting past their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from darkroom.queue import Derived, Lease

T = TypeVar("T")
# How a batch's statement is tried: the call, and the leases it commits (the worker retries
# it through a database fault while any of them may still hold).
Retry = Callable[[Callable[[], Awaitable[T]], Sequence[Lease]], Awaitable[T]]

MAX_BATCH = 100
# How long the next batch waits for one in flight before it is committed beside it: a
# statement's time when the database answers, far less than any lease.
GATHER_SECONDS = 0.5


class Completions(Protocol):
    """The queue call the completer makes (`Queue.complete_many`)."""

    async def complete_many(self, results: Sequence[tuple[Lease, Derived]]
                            ) -> set[uuid.UUID]: ...


class Completer:
    def __init__(self, queue: Completions, retry: Retry[set[uuid.UUID]], *,
                 max_batch: int = MAX_BATCH) -> None:
        self.queue = queue
        self._retry = retry
        self.max_batch = max_batch
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
                    await self._one_settles()
                    batch = self._pending[:self.max_batch]
                    del self._pending[:self.max_batch]
                    task = asyncio.create_task(self._commit(batch), name="complete-batch")
                    self._committing.add(task)
                    task.add_done_callback(self._done)
        finally:
            for task in list(self._committing):
                task.cancel()
            for *_, answer in self._pending:
                answer.cancel()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._committing.discard(task)
        self._settled.set()

    async def _one_settles(self) -> None:
        """Wait for a batch in flight to settle, at most `GATHER_SECONDS`."""
        self._settled.clear()
        if not self._committing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), GATHER_SECONDS)

    async def _commit(self, batch: list[tuple[Lease, Derived, asyncio.Future[bool]]]) -> None:
        results = [(lease, derived) for lease, derived, _ in batch]
        try:
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


@contextlib.asynccontextmanager
async def running(completer: Completer) -> AsyncIterator[Completer]:
    """The completer's task for the length of a block."""
    task = asyncio.create_task(completer.run(), name="completer")
    try:
        yield completer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
