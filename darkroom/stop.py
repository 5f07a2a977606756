"""A worker's stop: one deadline for all of it, and what does not answer in time given up.

A signal starts the stop: the running jobs get the shutdown grace, and the stop as a whole
(handing leases back, waiting for what it cancelled) ends `STOP_MARGIN_SECONDS` after the
grace. Every wait of the stop takes what the deadline leaves (`left`). A database or a
store that froze with calls on their way holds none of it: a task that does not answer
in time is given up (`give_up`): cancelled and no longer waited for, and cancelled again
at the very end (`end_given_up`), because a statement cancelled once makes psycopg wait
up to 5 + 5 s for the server to confirm the cancellation. What a given-up call leased
waits out its lease; nothing runs twice.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Collection
from typing import Any, TypeVar

T = TypeVar("T")

# A stop's deadline is the shutdown grace and this long: handing the leases back, then
# waiting for what it cancelled.
STOP_MARGIN_SECONDS = 6.0
# Past the deadline: ending what was given up, then closing the pool, each at most this
# long. The whole stop so ends within the grace and 8 s, the process's own exit included
# (OPERATIONS.md: an orchestrator's kill timeout of grace + 10 s is never reached).
END_SECONDS = 0.5


class StopDeadline:
    """When the running jobs' grace ends and when the whole stop must end (monotonic;
    never, until a stop begins), and the tasks the stop gave up."""

    def __init__(self) -> None:
        self.grace_until = math.inf
        self.stop_by = math.inf
        self._given_up: set[asyncio.Task[Any]] = set()

    def within(self, grace: float) -> None:
        """The running jobs' grace ends `grace` from now, unless it ends sooner already;
        the stop ends STOP_MARGIN_SECONDS after it."""
        self.grace_until = min(self.grace_until, time.monotonic() + grace)
        self.stop_by = self.grace_until + STOP_MARGIN_SECONDS

    def grace_left(self) -> float:
        """What is left of the running jobs' grace (all of time when not stopping)."""
        return max(0.0, self.grace_until - time.monotonic())

    def left(self, cap: float = math.inf) -> float:
        """Of `cap` seconds, what the deadline leaves (all of it when not stopping)."""
        return max(0.0, min(cap, self.stop_by - time.monotonic()))

    def give_up(self, task: asyncio.Task[Any]) -> None:
        """Cancel a task and stop waiting for it: the stop goes on meanwhile, and
        `end_given_up` cuts the wait of a cancellation the server does not confirm."""
        task.cancel()
        self._given_up.add(task)
        task.add_done_callback(self._given_up.discard)

    async def answer(self, seconds: float, call: Awaitable[T]) -> T:
        """`call`'s answer within `seconds`, else TimeoutError; a call that did not answer
        is given up, not waited for."""
        task = asyncio.ensure_future(call)
        try:
            await asyncio.wait([task], timeout=seconds)
        finally:
            if not task.done():
                self.give_up(task)
        if not task.done():
            raise TimeoutError
        return task.result()

    async def settle(self, tasks: Collection[asyncio.Task[Any]]) -> None:
        """Wait for these tasks while the deadline allows; give up the rest. A task's own
        error is retrieved: it ends with the stop."""
        pending = [task for task in tasks if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.left())
        for task in pending:
            if not task.done():
                self.give_up(task)
            elif not task.cancelled():
                task.exception()

    async def end_given_up(self) -> None:
        """End what the stop gave up: cancelled again, a task no longer waits for the
        server to confirm its first cancellation, so nothing outlives the stop."""
        for task in list(self._given_up):
            task.cancel()
        if self._given_up:
            await asyncio.wait(set(self._given_up), timeout=END_SECONDS)
