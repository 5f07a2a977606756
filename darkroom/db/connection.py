"""Where the database is, and the psycopg pool every component uses."""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from darkroom.config import Settings
from darkroom.db import embedded

# Every pooled connection notices a dead peer and bounds every statement, so a half-open
# socket (a NAT timeout, a failover, a cut link) becomes an ordinary error in tens of
# seconds instead of a wait for ever: TCP keepalives probe an idle socket, the user timeout
# bounds unacknowledged sends, and the server ends a statement or an idle transaction that
# runs too long. (libpq ignores the TCP settings on a Unix socket.)
SESSION_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
    "options": "-c statement_timeout=60000 -c idle_in_transaction_session_timeout=60000",
}

# A worker's connections keep one plan per prepared statement. Its statements take their
# rows as arrays, and a generic plan prices unnest() of an array parameter at 100 rows:
# under the default `auto` mode, once the table holds a backlog, PostgreSQL finds a custom
# plan cheaper for the usual one or few rows and plans a fenced commit of a single result
# again at every execution (about half of its CPU; bench/fleet.py). Every statement a
# worker sends is written for a plan made without its values (rows by id or by array of
# ids, literal statuses, no parameter in a partial index's predicate), so the generic
# plan is the one a custom plan would pick. The API and the sweeper keep `auto`: a
# listing's optional filters and a sweep's limits want the plan of their values.
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"


def database_url(settings: Settings) -> str:
    """The configured database, or the embedded one in the data dir."""
    if settings.database_url:
        return settings.database_url
    return embedded.url(settings.data_path / "pg")


async def open_pool(conninfo: str, *, min_size: int = 1, max_size: int = 8,
                    name: str = "darkroom", fail_fast: bool = True,
                    generic_plans: bool = False,
                    wait_seconds: float = 30.0) -> AsyncConnectionPool:
    """An opened pool; connections that died with a server restart are checked out again.

    With `fail_fast`, an unreachable server raises psycopg's own one-line error at once
    instead of the pool retrying in the background; long-running services pass False.
    With `generic_plans`, prepared statements keep one plan (GENERIC_PLANS). A caller
    waits at most `wait_seconds` for a connection, then gets psycopg_pool.PoolTimeout.
    """
    options = dict(SESSION_OPTIONS)
    if generic_plans:
        options["options"] = f"{options['options']} {GENERIC_PLANS}"
    if fail_fast:
        probe = await psycopg.AsyncConnection.connect(conninfo, connect_timeout=10)
        await probe.close()
    pool = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=wait_seconds,
        open=False,
        kwargs={"autocommit": True, "row_factory": dict_row, **options},
        check=check_if_suspect,
    )
    await pool.open(wait=True, timeout=30)
    return pool


async def check_if_suspect(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check on checkout: a round trip only for a connection that looks dead.

    An idle pooled connection is sent nothing unless the server is closing it (restart,
    shutdown, terminated backend: an error message, then end of file), so a readable
    socket is the sign worth a round trip. A quiet one is handed out as is: checking
    every checkout would add a round trip to every request, and a connection that still
    fails is then an ordinary database error to its caller.
    """
    if not conn.closed and conn.pgconn.socket >= 0:
        # poll, not select: select() cannot watch descriptors numbered 1024 and above.
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        if not poller.poll(0):
            return
    await AsyncConnectionPool.check_connection(conn)
