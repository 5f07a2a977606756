"""The store breaker: a worker stops claiming while the object store is failing.

Without it, an outage of the store (or credentials that expired, a clock skewed past what
signatures allow) would fail every claimed card, and the whole backlog would spend its
attempts in minutes and end rejected. With it, every attempt that meets a store error is
handed back with its attempt given back (the store's fault is never the file's), and the
store is asked whether it serves at all: a probe, a canary object written, read back and
deleted (canary.py), so a front that answers while its data servers are down does not
pass. If the probe fails, or the attempt ran out of time waiting on the store, the breaker
opens: the worker claims nothing more until a probe succeeds again, probing with a
backoff.

The breaker also remembers when the store last served this worker (`served_at`): a file
that the store fails while it serves others between the file's tries is the file's own
trouble, and the worker counts that deferral against the file (DARKROOM_MAX_DEFERRALS).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from darkroom import metrics
from darkroom.errors import StorageError

log = logging.getLogger("darkroom.worker")

PROBE_FIRST_SECONDS = 1.0
PROBE_CAP_SECONDS = 30.0


class StoreBreaker:
    """Closed (claiming) or open (paused until a probe answers). One per worker."""

    def __init__(self, probe: Callable[[], Awaitable[None]], *,
                 on_change: Callable[[bool, str], Awaitable[None]] | None = None,
                 rng: random.Random | None = None,
                 cap_seconds: float = PROBE_CAP_SECONDS) -> None:
        self._probe = probe
        # Probes back off to at most this (never below a tenth of a second).
        self._cap = max(0.1, min(cap_seconds, PROBE_CAP_SECONDS))
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._closed = asyncio.Event()
        self._closed.set()
        self._opened = asyncio.Event()
        self._lock = asyncio.Lock()
        self.reason = ""
        self.opened_at: float | None = None
        # When (monotonic) the store last served a request of this worker: a probe or a
        # job's read or write. 0: not yet.
        self.served_at = 0.0
        self._notifying: set[asyncio.Task[None]] = set()
        self._notify_lock = asyncio.Lock()

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set()

    def served(self) -> None:
        """The store just served a request of this worker."""
        self.served_at = time.monotonic()

    async def store_answers(self) -> bool:
        """One probe; a failure opens the breaker (once, however many jobs ask)."""
        async with self._lock:
            if self.is_open:
                return False
            try:
                await self._probe()
            except StorageError as exc:
                self._open(type(exc).__name__)
                return False
            self.served()
            return True

    def trip(self, reason: str) -> None:
        """Open without a probe: a request waited on the store past its deadline, and a
        probe would only wait as long again."""
        if not self.is_open:
            self._open(reason)

    def _open(self, reason: str) -> None:
        self.reason = reason
        self.opened_at = time.monotonic()
        self._closed.clear()
        self._opened.set()
        metrics.WORKER_PAUSED.set(1)
        metrics.BREAKER_OPENED.inc()
        log.warning("object store failing; no new claims until it answers",
                    extra={"error": reason})
        # Recorded in the background: the job that opened the breaker goes on to hand
        # its card back at once, whatever the database's state.
        task = asyncio.create_task(self._notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def run(self) -> None:
        """While open, probe with a jittered backoff; close when the store answers."""
        while True:
            await self._opened.wait()
            delay = min(PROBE_FIRST_SECONDS, self._cap)
            while self.is_open:
                await asyncio.sleep(delay * self._rng.uniform(0.5, 1.5))
                try:
                    await self._probe()
                except StorageError as exc:
                    self.reason = type(exc).__name__
                    delay = min(delay * 2, self._cap)
                    await self._notify()  # refreshes what `darkroom stats` shows
                    continue
                self.served()
                paused = time.monotonic() - (self.opened_at or time.monotonic())
                log.info("object store answers again; claiming",
                         extra={"paused_seconds": round(paused, 1)})
                metrics.WORKER_PAUSED.set(0)
                self._opened.clear()
                self._closed.set()
                await self._notify()

    async def _notify(self) -> None:
        """Record the breaker's state as it is now. One at a time, each reading the state
        when it runs, so the last record is always the current state even when the pause
        recorded in the background is still on its way as the breaker closes."""
        if self._on_change is None:
            return
        async with self._notify_lock:
            try:
                await self._on_change(self.is_open, self.reason)
            except Exception as exc:  # the database may be failing too; the log has it
                log.warning("could not record the pause", extra={"error": type(exc).__name__})
