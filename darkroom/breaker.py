"""The store breaker: a worker stops claiming while the object store is failing.

Without it, an outage of the store (or credentials that expired, a clock skewed past what
signatures allow) would fail every claimed card, and the whole backlog would spend its
attempts in minutes and end rejected. With it, the first attempt that meets a store error
asks the store whether it answers at all (a probe): if not, the store is down, the card is
handed back with its attempt given back, and the worker claims nothing more until a probe
succeeds again, probing with a backoff. Only when the store answers the probe is a failure
the file's own, and spends an attempt.
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
                 rng: random.Random | None = None) -> None:
        self._probe = probe
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._closed = asyncio.Event()
        self._closed.set()
        self._opened = asyncio.Event()
        self._lock = asyncio.Lock()
        self.reason = ""
        self.opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set()

    async def store_answers(self) -> bool:
        """One probe; a failure opens the breaker (once, however many jobs ask)."""
        async with self._lock:
            if self.is_open:
                return False
            try:
                await self._probe()
                return True
            except StorageError as exc:
                await self._open(type(exc).__name__)
                return False

    async def _open(self, reason: str) -> None:
        self.reason = reason
        self.opened_at = time.monotonic()
        self._closed.clear()
        self._opened.set()
        metrics.WORKER_PAUSED.set(1)
        log.warning("object store failing; no new claims until it answers",
                    extra={"error": reason})
        await self._notify(True)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def run(self) -> None:
        """While open, probe with a jittered backoff; close when the store answers."""
        while True:
            await self._opened.wait()
            delay = PROBE_FIRST_SECONDS
            while self.is_open:
                await asyncio.sleep(delay * self._rng.uniform(0.5, 1.5))
                try:
                    await self._probe()
                except StorageError as exc:
                    self.reason = type(exc).__name__
                    delay = min(delay * 2, PROBE_CAP_SECONDS)
                    await self._notify(True)  # refreshes what `darkroom stats` shows
                    continue
                paused = time.monotonic() - (self.opened_at or time.monotonic())
                log.info("object store answers again; claiming",
                         extra={"paused_seconds": round(paused, 1)})
                metrics.WORKER_PAUSED.set(0)
                self._opened.clear()
                self._closed.set()
                await self._notify(False)

    async def _notify(self, paused: bool) -> None:
        if self._on_change is None:
            return
        try:
            await self._on_change(paused, self.reason)
        except Exception as exc:  # the database may be failing too; the log has it
            log.warning("could not record the pause", extra={"error": type(exc).__name__})
