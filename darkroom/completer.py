"""The completer: a worker's fenced commits, batched into one statement each.

Jobs hand their result to the completer and wait for its answer. While one batch is being
committed, the results that arrive meanwhile gather into the next, so an idle worker
commits at once and a busy one commits many jobs per round trip. Each row of a batch is
still fenced by its own token (`Queue.complete_many`): a lost lease is lost for that row
alone, and a batch repeated after its answer was lost is recognized row by row.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from darkroom.queue import Derived, Lease, Queue

T = TypeVar("T")
# How a batch's statement is tried: the call, and the leases it commits (the worker retries
# it through a database fault while any of them may still hold).
Retry = Callable[[Callable[[], Awaitable[T]], Sequence[Lease]], Awaitable[T]]

MAX_BATCH = 100


class Completer:
    def __init__(self, queue: Queue, retry: Retry[set[uuid.UUID]], *,
                 max_batch: int = MAX_BATCH) -> None:
        self.queue = queue
        self._retry = retry
        self.max_batch = max_batch
        self._pending: list[tuple[Lease, Derived, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()

    async def complete(self, lease: Lease, derived: Derived) -> bool:
        """Publish one result; True if published, False if the lease was lost."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((lease, derived, answer))
        self._wake.set()
        return await answer

    async def run(self) -> None:
        """Commit what is pending, batch after batch, until cancelled."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    batch = self._pending[:self.max_batch]
                    del self._pending[:self.max_batch]
                    await self._commit(batch)
        finally:
            for *_, answer in self._pending:
                answer.cancel()

    async def _commit(self, batch: list[tuple[Lease, Derived, asyncio.Future[bool]]]) -> None:
        results = [(lease, derived) for lease, derived, _ in batch]
        try:
            lost = await self._retry(lambda: self.queue.complete_many(results),
                                     [lease for lease, _ in results])
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
