"""The pages' watch on card changes: status changes are pushed to the pages (NOTIFY
darkroom_cards) only while it is on.

A transaction that NOTIFYs holds one cluster-wide lock from its commit's start to its
end, WAL flush included, so notices nobody reads made every claim and publication of a
fleet wait for each other's commits. The watch is one row (`card_watch`, migration
0024): the end of the pages' watch, which an API process moves forward while it has a
page open, and `darkroom_notify_cards` notifies only before it.

Turning it on must not let a change slip past a page: a status change that read the
watch as off just before it was turned on may still be on its way to its commit, and
would reach neither the page's notices nor a read the page made before that commit. Each
such change holds its write lock on archive_files until it ends (the function reads the
watch after the change's rows are written, with a snapshot of its own), so `turn_on`
waits for every transaction holding one; a page that reads after that sees every change
the watch did not notify.

An API process keeps its own reckoning of how long the watch is sure to be on: from the
moment it asked for an extension, `seconds` less `margin`, on a clock that runs while the
host sleeps. An extension that comes after that moment, or that finds the watch's end
less than `margin` ahead by the database's clock (its clock stepped, another process's
reckoning, an extension lost in a failover), may have left a gap, and is treated as
turning the watch on again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from darkroom.db.database import Database

__all__ = ["WATCH_SECONDS", "Watch"]

# How far each extension moves the watch's end; an API process with a page open extends
# it every third of that. A watch left by a process that stopped ends by itself.
WATCH_SECONDS = 60.0
# Taken off the watch's end in an API process's own reckoning: the database's clock and
# the process's may run apart, and a change compares the watch with its transaction's start.
MARGIN_SECONDS = 5.0
# How often the transactions that read the watch as off are looked for again while they
# end: doubling from the first to the last.
_POLL_FIRST, _POLL_LAST = 0.002, 0.25


def _clock() -> float:
    """Seconds on a clock that keeps running while the host is suspended (the database's
    does): a monotonic one that stops would reckon the watch on past its end."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Watch:
    """One API process's view of the pages' watch."""

    def __init__(self, db: Database, *, seconds: float = WATCH_SECONDS,
                 margin: float = MARGIN_SECONDS,
                 clock: Callable[[], float] = _clock) -> None:
        if seconds <= margin:
            raise ValueError("the watch must last longer than its margin")
        self.db = db
        self.seconds = seconds
        self.margin = margin
        self.clock = clock
        # Until when (by `clock`) the watch is sure to be on; before any extension, never.
        self._sure_until = float("-inf")
        # The transactions turn_on still waits for (0 when it waits for none).
        self.waiting_for = 0

    def is_on(self) -> bool:
        """Whether every status change is sure to notify now."""
        return self.clock() < self._sure_until

    def due(self) -> float:
        """Seconds until the next extension is due (a third of the watch's length after the
        last one), or 0 if it is due now."""
        return max(0.0, self._sure_until + self.margin - self.seconds * 2 / 3 - self.clock())

    async def extend(self) -> bool:
        """Move the watch's end forward. Answers True when it was on throughout (no change
        can have skipped its notice), False when it may have been off: then `turn_on`'s
        wait is owed before the notices are trusted."""
        asked = self.clock()
        row = await self.db.row("extend_card_watch",
                                {"seconds": self.seconds, "margin": self.margin})
        # Answered before the end this process reckoned (so committed before it), and
        # the end the database held still ahead by its own clock: no gap.
        unbroken = self.clock() < self._sure_until and row is not None and bool(row["ahead"])
        self._sure_until = max(self._sure_until, asked + self.seconds - self.margin)
        return unbroken

    async def turn_on(self) -> None:
        """Extend the watch, and answer once every status change is either notified or
        visible to a read that starts after this returns."""
        if not await self.extend():
            await self.settle()

    async def settle(self, wanted: Callable[[], bool] = lambda: True) -> bool:
        """Wait for every transaction that may have read the watch as off: each one that
        holds a write lock on archive_files now. The watch is kept on meanwhile (a writer
        may hold its lock for as long as its statement timeout); should an extension
        leave a gap, the wait starts again from the writers of then. Gives up, answering
        False, once `wanted()` says the watch is no longer wanted."""
        waiting = await self._writers()
        delay = _POLL_FIRST
        try:
            while waiting:
                if not wanted():
                    return False
                self.waiting_for = len(waiting)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _POLL_LAST)
                if self.due() == 0 and not await self.extend():
                    waiting = await self._writers()
                    continue
                # A transaction keeps its lock until it ends, and its id is never reused
                # by a later one: those still holding it are still running.
                waiting &= await self._writers()
        finally:
            self.waiting_for = 0
        return True

    async def _writers(self) -> set[str]:
        return {row["writer"] for row in await self.db.rows("card_writers")}
