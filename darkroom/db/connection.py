"""Where the database is, and the psycopg pool every component uses."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from darkroom.config import Settings
from darkroom.db import embedded


def database_url(settings: Settings) -> str:
    """The configured database, or the embedded one in the data dir."""
    if settings.database_url:
        return settings.database_url
    return embedded.url(settings.data_path / "pg")


async def open_pool(conninfo: str, *, min_size: int = 1, max_size: int = 8,
                    name: str = "darkroom", fail_fast: bool = True) -> AsyncConnectionPool:
    """An opened pool; connections that died with a server restart are checked out again.

    With `fail_fast`, an unreachable server raises psycopg's own one-line error at once
    instead of the pool retrying in the background; long-running services pass False.
    """
    if fail_fast:
        probe = await psycopg.AsyncConnection.connect(conninfo, connect_timeout=10)
        await probe.close()
    pool = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": True, "row_factory": dict_row},
        check=AsyncConnectionPool.check_connection,
    )
    await pool.open(wait=True, timeout=30)
    return pool
