"""Status changes pushed to the web page as server-sent events (`GET /v1/events`).

Every status change is made by one of queue.py's statements, which turn each statement's
changes into one `NOTIFY darkroom_cards` (migration 0009) while the pages' watch is on
(darkroom/watch.py, migration 0024). Each API process holds ONE listening connection,
whatever the number of open pages, keeps the watch on while it has a page open, and hands
every change to the streams of the card's owner only.

A page that may have missed notifications (its stream was down, its buffer overflowed,
the listening connection was lost, or the watch was off) gets a `resync` event and
re-reads what it shows: every time this process's notices become complete again (the
listener in place and the watch on), each open stream is told so.

A stream is bounded: each owner has at most `max_per_owner` open in a process (a new
one ends the oldest, with `end` `replaced`); each lives at most `max_seconds` (then
`end` `max_age`: the page reconnects at once and re-reads); and its key is looked up
again every `recheck_seconds`, so a revoked key stops listening as soon as it stops
being served (`end` `revoked`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from darkroom.db.database import Database
from darkroom.watch import Watch

log = logging.getLogger(__name__)

CHANNEL = "darkroom_cards"
# A page that falls this far behind is told to re-read instead of being sent the backlog.
_BUFFER = 256
_RESYNC: dict[str, Any] = {"type": "resync"}
_REPLACED: dict[str, Any] = {"type": "end", "reason": "replaced"}

Event = dict[str, Any] | None  # None ends the stream (shutdown)


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


def _read_notice(payload: str) -> tuple[list[tuple[str, str, str]] | None,
                                        list[str] | str | None]:
    """(changes, owners) of a card notification: `{"c": [[owner, id, status], ...]}`,
    `{"o": [owner, ...]}` or `{"o": "*"}`; (None, None) for anything else."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    listed, named = body.get("c"), body.get("o")
    if isinstance(listed, list) and all(
            isinstance(c, list) and len(c) == 3 and all(isinstance(v, str) for v in c)
            for c in listed):
        return [(c[0], c[1], c[2]) for c in listed], None
    if named == "*":
        return None, "*"
    if isinstance(named, list) and all(isinstance(o, str) for o in named):
        return None, named
    return None, None


class Hub:
    """Owner → open streams; one LISTEN connection, started with the first stream."""

    def __init__(self, db: Database, *, ping_seconds: float, max_per_owner: int = 8,
                 max_seconds: float = 900.0, recheck_seconds: float = 5.0,
                 watch: Watch | None = None) -> None:
        self.db = db
        self.watch = watch or Watch(db)
        self.ping_seconds = ping_seconds
        self.max_per_owner = max_per_owner
        self.max_seconds = max_seconds
        self.recheck_seconds = recheck_seconds
        # Each owner's streams, oldest first, and whether each has said it is open.
        self._streams: dict[str, dict[asyncio.Queue[Event], bool]] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        # Complete notices need both: the listener in place and the watch on.
        self._listening = False
        self._watched = False
        self._complete = asyncio.Event()
        # Bumped when the listener comes back: the watch is settled again after it.
        self._resettle = 0
        # Set when a page opens: the watch is kept on only while one is open.
        self._wanted = asyncio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

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
        streams[queue] = False
        if self._closed:
            queue.put_nowait(None)
        elif self._task is None:
            self._task = asyncio.create_task(self._listen(), name="events-listen")
            self._watch_task = asyncio.create_task(self._keep_watch(), name="events-watch")
        self._wanted.set()
        # A change made right after the page's first read must not slip past: wait (a
        # little) until the notices are complete before the stream says it is open. Past
        # that wait the page is told to re-read once they are (`_notices`).
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._complete.wait(), 5.0)
        except BaseException:
            # The page went away before its stream opened: it is not waited for, and
            # keeps neither a place among its owner's streams nor the watch on.
            self.unsubscribe(owner, queue)
            raise
        if queue in streams:  # not replaced meanwhile
            streams[queue] = True
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
        for task in (self._task, self._watch_task):
            if task is not None:
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

    def _broadcast(self, event: dict[str, Any]) -> None:
        """`event` to every stream that has said it is open (the others say so only once
        every later change will reach them)."""
        for streams in self._streams.values():
            for queue, opened in streams.items():
                if opened:
                    self._offer(queue, event)

    def dispatch(self, payload: str) -> None:
        """One notification's payload to the streams of the owners it names. Anything on
        the channel that is not one of darkroom_notify_cards' shapes (whoever can reach
        the database can NOTIFY it) is logged and left, never let out of the listener."""
        changes, owners = _read_notice(payload)
        if changes is None and owners is None:
            log.warning("unreadable card notification")
            return
        for owner, file_id, status in changes or ():
            for queue in self._streams.get(owner, ()):
                self._offer(queue, {"type": "status", "id": file_id, "status": status})
        if owners == "*":
            self._broadcast(_RESYNC)
            return
        for owner in owners or ():
            for queue in self._streams.get(owner, ()):
                self._offer(queue, _RESYNC)

    def _notices(self, *, listening: bool | None = None, watched: bool | None = None) -> None:
        """Record a change of the listener's or the watch's state. Notices that become
        complete again may have missed changes meanwhile (never sent, or sent to nobody):
        every open stream is told to re-read."""
        if listening is not None:
            self._listening = listening
        if watched is not None:
            self._watched = watched
        if not (self._listening and self._watched):
            self._complete.clear()
        elif not self._complete.is_set():
            self._complete.set()
            self._broadcast(_RESYNC)

    async def _listen(self) -> None:
        delay = 0.5
        first = True
        while not self._closed:
            try:
                async with self.db.listen(CHANNEL) as notifications:
                    delay = 0.5
                    if not first:
                        # Lost, as by a failover: the watch is settled again too (the
                        # database's last extension may have been lost with it).
                        self._resettle += 1
                        self._notices(listening=True, watched=False)
                        self._wanted.set()
                    else:
                        self._notices(listening=True)
                    first = False
                    async for payload in notifications:
                        self.dispatch(payload)
            except Exception as exc:  # the listener must outlive any fault: it is retried
                first = False
                self._notices(listening=False)
                log.warning("events LISTEN connection lost", extra={"error": type(exc).__name__})
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)

    async def _keep_watch(self) -> None:
        """Keep the pages' watch on while this process has a page open; with none, let it
        end by itself."""
        delay = 0.5
        while not self._closed:
            if not self._streams:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            if not self.watch.is_on():
                self._notices(watched=False)
            elif self._watched and (wait := self.watch.due()) > 0:
                # A page opening wakes this early, to find nothing due yet.
                self._wanted.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), wait)
                continue
            try:
                asked = self._resettle
                unbroken = await self.watch.extend()
                settled = unbroken and self._watched
                if not settled:
                    # It may have been off: changes may be on their way unnotified. Given
                    # up once no page is open (a VACUUM-long change keeps it on for none).
                    self._notices(watched=False)
                    settled = await self.watch.settle(lambda: bool(self._streams))
                # Not if the listener came back meanwhile: that asks for a settle of its own.
                if settled and self.watch.is_on() and asked == self._resettle:
                    self._notices(watched=True)
                delay = 0.5
            except Exception as exc:  # the database's trouble: tried again, never fatal
                log.warning("pages' watch not extended", extra={"error": type(exc).__name__})
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)
