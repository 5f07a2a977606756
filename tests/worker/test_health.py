"""The worker's health listener: 200 while its event loop turns, 503 once it is stuck."""

from __future__ import annotations

import asyncio
import time

import httpx

from darkroom import health
from tests.support.services import free_port


async def test_healthz_follows_the_event_loop() -> None:
    pulse = health.LoopPulse()
    port = free_port()
    server = health.serve("127.0.0.1", port, pulse)
    ticking = asyncio.create_task(pulse.run())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await asyncio.sleep(0)  # one tick of the loop
            assert (await client.get("/healthz")).status_code == 200
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200 and b"darkroom_jobs_total" in metrics.content
            ticking.cancel()
            pulse.last = time.monotonic() - health.STALE_SECONDS - 1  # the loop stopped
            assert (await client.get("/healthz")).status_code == 503
    finally:
        ticking.cancel()
        server.shutdown()
