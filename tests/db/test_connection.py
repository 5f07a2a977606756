"""The pool's checkout check: quiet connections go out as they are, dead ones are replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import psycopg
import psycopg_pool
import pytest

from darkroom.api.app import CONNECTION_WAIT_SECONDS
from darkroom.db.connection import SESSION_OPTIONS, check_if_suspect, open_pool
from darkroom.db.database import Database
from tests.support.services import wait_for


async def test_a_terminated_connection_is_replaced_on_checkout(db_url: str) -> None:
    pool = await open_pool(db_url, min_size=1, max_size=1)
    try:
        async with pool.connection() as conn:
            found = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
        assert found is not None
        first = cast("dict[str, Any]", found)  # the pool's rows are dicts
        # The server ends the backend: the idle pooled socket gets an error, then EOF.
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first["pid"],))
            wait_for(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity"
                                           " WHERE pid = %s", (first["pid"],)).fetchone()
                     == (0,), timeout=10, what="the backend to exit")
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
        assert row is not None and cast("dict[str, Any]", row)["pid"] != first["pid"]
    finally:
        await pool.close()


async def test_a_quiet_connection_is_handed_out_without_a_round_trip(
    db_url: str, tmp_path: Path
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # libpq's protocol trace records every message the connection sends or receives.
        with open(tmp_path / "trace", "w") as trace:
            conn.pgconn.trace(trace.fileno())
            await check_if_suspect(conn)
            conn.pgconn.untrace()
        assert (tmp_path / "trace").read_text() == ""
        await conn.execute("SELECT 1")  # and it is still a working connection


async def test_a_caller_waits_for_a_connection_no_longer_than_the_pools_bound(
    db_url: str
) -> None:
    """While every connection is taken (or broken by an outage and not yet replaced), a
    caller gets PoolTimeout after the pool's bound, which the API answers as 503."""
    db = await Database.open(db_url, name="bounded", min_size=1, max_size=1,
                             wait_seconds=0.2)
    try:
        async with db.pool.connection():
            with pytest.raises(psycopg_pool.PoolTimeout):
                await db.rows("ping")
        assert await db.rows("ping")  # free again, it is handed out
    finally:
        await db.close()


def test_the_api_waits_for_a_connection_less_than_an_unanswered_statement_lasts() -> None:
    """A call of the API during an outage: its wait for a connection plus a statement the
    lost link never answers stays within twice the TCP user timeout."""
    assert SESSION_OPTIONS["tcp_user_timeout"] / 1000 >= CONNECTION_WAIT_SECONDS
