"""A pool and a listener given a primary and its standby (`target_session_attrs=read-write`)
follow a promotion by themselves: no reopening, no restart."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from darkroom.db.database import CONNECTION_ERRORS, Database
from tests.support.replica import ReplicatedPostgres

# Two PostgreSQL servers of its own: not in `make test-fast`.
pytestmark = pytest.mark.slow


async def test_a_pool_and_a_listener_follow_a_promoted_standby() -> None:
    pg = await asyncio.to_thread(ReplicatedPostgres, synchronous=True)
    db = await Database.open(pg.url, name="failover-test", min_size=2, max_size=2)
    heard: asyncio.Queue[str] = asyncio.Queue()

    async def listener() -> None:
        # What the worker and the API's event stream do: listen again after a loss.
        while True:
            try:
                async with db.listen("failover_test") as payloads:
                    await heard.put("listening")
                    async for payload in payloads:
                        await heard.put(payload)
            except CONNECTION_ERRORS:
                await asyncio.sleep(0.1)

    task = asyncio.create_task(listener())
    try:
        assert await asyncio.wait_for(heard.get(), 10) == "listening"
        await db.ping(5)
        await asyncio.to_thread(pg.kill_primary)
        await asyncio.to_thread(pg.promote)
        killed = time.monotonic()
        # A statement caught by the kill is an unknown outcome to its caller; the pool
        # then hands out connections to the new primary.
        while True:
            try:
                await db.ping(5)
                break
            except CONNECTION_ERRORS:
                assert time.monotonic() - killed < 15, "the pool did not follow"
                await asyncio.sleep(0.1)
        async with db.pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT inet_server_port() AS port, pg_is_in_recovery() AS standby")
            ).fetchone()
        assert row == {"port": pg.ports[1], "standby": False}
        # The listener is back on the new primary and hears what is sent there.
        assert await asyncio.wait_for(heard.get(), 15) == "listening"
        with psycopg.connect(pg.primary_url, autocommit=True) as conn:
            conn.execute("NOTIFY failover_test, 'after'")
        assert await asyncio.wait_for(heard.get(), 10) == "after"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.close()
        await asyncio.to_thread(pg.stop)
