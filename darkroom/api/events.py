"""Status changes pushed to the web page as server-sent events (`GET /v1/events`).

Every status change is made by one of queue.py's statements, which passes the cards it
changed to darkroom_notify_cards (migration 0009): one `NOTIFY darkroom_cards` per
statement. Each API process holds ONE listening connection, whatever the number of open
pages, and hands every change to the streams of the card's owner only.

Statements notify only while a hub has announced that it listens (migration 0022): a
NOTIFY makes its transaction's commit wait for every other notifying commit, which nobody
should pay while no page is open. The hub renews its announce while it has streams. When
it cannot tell that its announce held all along (its first, one after a pause without
streams, after failed renewals), a statement may have changed a card without notifying:
the hub then waits for the transactions running after its announce to end, and sends its
pages `resync`. A new stream waits for that (at most SETTLE_SECONDS) before it opens, so
its first read already holds those changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg

from darkroom.db.database import Database

log = logging.getLogger(__name__)

CHANNEL = "darkroom_cards"
# A page that falls this far behind is told to re-read instead of being sent the backlog.
_BUFFER = 256
_RESYNC: dict[str, Any] = {"type": "resync"}
_REPLACED: dict[str, Any] = {"type": "end", "reason": "replaced"}

Event = dict[str, Any] | None  # None ends the stream (shutdown)

# How long an announce holds, and how often the hub renews it while it has streams: each
# renewal comes long before the last one ends.
ANNOUNCE_SECONDS = 60
RENEW_SECONDS = 15.0
# How long the hub waits, after an announce that followed a lapse, for the transactions
# that were running; one still running then is waited on in the background.
SETTLE_SECONDS = 3.0
# How long a new stream waits for the listener and the hub's announce (a busy pool).
ANNOUNCE_WAIT_SECONDS = 5.0
_SETTLE_POLL = 0.02


def _end(reason: str) -> str:
    return f"event: end\ndata: {json.dumps({'type': 'end', 'reason': reason})}\n\n"


async def _valid(still_valid: Callable[[], Awaitable[bool]]) -> bool:
    """A failed check ends the stream too: the page reconnects, and its key is looked up
    as any request's is."""
    try:
        return await still_valid()
    except Exception:
        log.warning("events key check failed")
        return False


class Hub:
    """Owner → open streams; one LISTEN connection, started with the first stream."""

    def __init__(self, db: Database, *, ping_seconds: float, max_per_owner: int = 8,
                 max_seconds: float = 900.0, recheck_seconds: float = 5.0) -> None:
        self.db = db
        self.ping_seconds = ping_seconds
        self.max_per_owner = max_per_owner
        self.max_seconds = max_seconds
        self.recheck_seconds = recheck_seconds
        # Each owner's streams, oldest first.
        self._streams: dict[str, dict[asyncio.Queue[Event], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._announcing = asyncio.Lock()
        self._announced_at: float | None = None  # the loop's time before the last announce
        # The database's epoch second up to which this hub knows every change notified.
        self._covered_until: float | None = None
        self._settling: asyncio.Task[None] | None = None  # the last settle owed
        self._waiting: set[asyncio.Queue[Event]] = set()  # new streams waiting for it
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def streams(self) -> int:
        return sum(len(s) for s in self._streams.values())

    async def subscribe(self, owner: str) -> asyncio.Queue[Event]:
        """A new stream for `owner`; answers once the listener is up (or failing)."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue(_BUFFER)
        streams = self._streams.setdefault(owner, {})
        while len(streams) >= self.max_per_owner:
            oldest = next(iter(streams))
            del streams[oldest]
            self._offer(oldest, _REPLACED, force=True)
        streams[queue] = None
        if self._closed:
            queue.put_nowait(None)
        elif self._task is None:
            self._task = asyncio.create_task(self._listen(), name="events-listen")
        # A change made right after the page's first read must not slip past: wait (a
        # little) until the listener is in place before the stream says it is open.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), ANNOUNCE_WAIT_SECONDS)
        if self._lapsing():  # no stream kept the announce alive
            await self._within(self._announce(), ANNOUNCE_WAIT_SECONDS)
        if self._settling is not None and not self._settling.done():
            # Its page reads after the settle, if the settle ends in time: no resync then.
            self._waiting.add(queue)
            try:
                await self._within(self._settling, SETTLE_SECONDS)
            finally:
                self._waiting.discard(queue)
        return queue

    def unsubscribe(self, owner: str, queue: asyncio.Queue[Event]) -> None:
        streams = self._streams.get(owner)
        if streams is not None:
            streams.pop(queue, None)
            if not streams:
                del self._streams[owner]

    def close(self) -> None:
        """End every stream (shutdown): a page reconnects to another process."""
        self._closed = True
        for streams in self._streams.values():
            for queue in streams:
                self._offer(queue, None, force=True)
        if self._task is not None:
            self._task.cancel()
        for task in list(self._background):
            task.cancel()

    def close_threadsafe(self) -> None:
        """`close()` from another thread than the server's loop."""
        if self._loop is None:
            self._closed = True
        else:
            with contextlib.suppress(RuntimeError):  # the loop already ended: nothing open
                self._loop.call_soon_threadsafe(self.close)

    async def stream(self, owner: str,
                     still_valid: Callable[[], Awaitable[bool]] | None = None
                     ) -> AsyncIterator[str]:
        """The text/event-stream body for one page of `owner`; `still_valid` answers
        whether the key it was opened with is still good."""
        loop = asyncio.get_running_loop()
        queue = await self.subscribe(owner)
        now = loop.time()
        ends = now + self.max_seconds
        next_ping = now + self.ping_seconds
        next_check = now + self.recheck_seconds
        try:
            # A reconnecting EventSource-style client waits this long before retrying.
            yield "retry: 2000\nevent: open\ndata: {}\n\n"
            while True:
                now = loop.time()
                if now >= ends:
                    yield _end("max_age")
                    return
                if still_valid is not None and now >= next_check:
                    if not await _valid(still_valid):
                        yield _end("revoked")
                        return
                    next_check = loop.time() + self.recheck_seconds
                    continue
                if now >= next_ping:
                    # Keeps proxies from closing an idle stream, and lets a page see that
                    # the stream is alive without asking anything.
                    yield "event: ping\ndata: {}\n\n"
                    next_ping = now + self.ping_seconds
                    continue
                wake = min(ends, next_ping, next_check if still_valid else ends)
                try:
                    event = await asyncio.wait_for(queue.get(), max(0.0, wake - now))
                except TimeoutError:
                    continue
                if event is None:
                    return
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                if event["type"] == "end":
                    return
        finally:
            self.unsubscribe(owner, queue)

    # --- the listener ------------------------------------------------------------------

    def _offer(self, queue: asyncio.Queue[Event], event: Event, *, force: bool = False) -> None:
        try:
            queue.put_nowait(event)
        except asyncio.QueueFull:
            # Behind: drop its backlog and tell it to re-read (or to stop, at shutdown).
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(event if force else _RESYNC)

    def _broadcast(self, event: dict[str, Any],
                   skip: set[asyncio.Queue[Event]] | None = None) -> None:
        for streams in self._streams.values():
            for queue in streams:
                if not skip or queue not in skip:
                    self._offer(queue, event)

    def dispatch(self, payload: str) -> None:
        """One notification's payload to the streams of the owners it names."""
        try:
            body = json.loads(payload)
        except ValueError:
            log.warning("unreadable card notification")
            return
        if "c" in body:
            for owner, file_id, status in body["c"]:
                for queue in self._streams.get(owner, ()):
                    self._offer(queue, {"type": "status", "id": file_id, "status": status})
        elif body.get("o") == "*":
            self._broadcast(_RESYNC)
        else:
            for owner in body.get("o", ()):
                for queue in self._streams.get(owner, ()):
                    self._offer(queue, _RESYNC)

    async def _listen(self) -> None:
        delay = 0.5
        first = True
        while not self._closed:
            try:
                async with self.db.listen(CHANNEL) as notifications:
                    delay = 0.5
                    # Listening first: a statement that reads the announce notifies us.
                    await self._announce()
                    self._listening.set()
                    if not first:
                        # Changes made while nobody listened were never sent.
                        self._broadcast(_RESYNC)
                    first = False
                    renewing = asyncio.create_task(self._renew(), name="events-announce")
                    try:
                        async for payload in notifications:
                            self.dispatch(payload)
                    finally:
                        renewing.cancel()
            except psycopg.Error as exc:
                self._listening.clear()
                log.warning("events LISTEN connection lost", extra={"error": type(exc).__name__})
                first = False
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)

    # --- the announce (migration 0022) ------------------------------------------------

    async def _within(self, work: Awaitable[Any], seconds: float) -> None:
        """Wait for `work` at most `seconds`, without cancelling it: a cancelled announce
        or settle would lose what it owes the pages."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)
        await asyncio.wait({task}, timeout=seconds)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("events announce failed", extra={"error": type(exc).__name__})

    def _lapsing(self) -> bool:
        """Whether the announce may end before the next renewal would come."""
        if self._announced_at is None:
            return True
        age = asyncio.get_running_loop().time() - self._announced_at
        return age > ANNOUNCE_SECONDS - RENEW_SECONDS

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            if not self._streams:
                continue  # the announce lapses; the next stream announces again
            try:
                await self._announce()
            except psycopg.Error as exc:
                log.warning("events announce failed", extra={"error": type(exc).__name__})

    async def _announce(self) -> None:
        """Tell the statements that pages listen. Unless this hub's last announce still
        held when this one was made, a settle is owed (`_settle`)."""
        async with self._announcing:
            loop = asyncio.get_running_loop()
            started = loop.time()
            row = await self.db.row("announce_listener", {"seconds": ANNOUNCE_SECONDS})
            assert row is not None  # one row, always
            held = self._covered_until is not None and row["at"] <= self._covered_until
            self._covered_until = float(row["until"])
            self._announced_at = started
            if not held:
                task = asyncio.create_task(self._settle(), name="events-settle")
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                self._settling = task

    async def _settle(self) -> None:
        """Wait until the transactions running after the announce have ended, then have
        every page re-read: one of them may have changed a card without notifying.
        Bounded: a transaction open longer than an announce is not one of darkroom's
        (their sessions end idle transactions), and the pages re-read regardless."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANNOUNCE_SECONDS
        snapshot: str | None = None
        while snapshot is None and loop.time() < deadline:
            try:
                running = await self.db.row("running_transactions")
                assert running is not None  # one row, always
                snapshot = str(running["snapshot"])
            except psycopg.Error:
                await asyncio.sleep(0.5)
        while snapshot is not None and loop.time() < deadline:
            try:
                row = await self.db.row("still_running", {"snapshot": snapshot})
                if row is not None and row["n"] == 0:
                    break
            except psycopg.Error:
                pass
            await asyncio.sleep(_SETTLE_POLL)
        self._broadcast(_RESYNC, skip=self._waiting)
