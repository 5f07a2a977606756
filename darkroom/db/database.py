"""The one way in to PostgreSQL: every statement the product runs goes through `Database`.

It holds the pool and sends the named statements of the `.sql` files beside it (see
`queries.py`); `LISTEN` runs on a connection of its own that it opens for the listener.
The protocol (`queue.Queue`), the sweeper's units, API keys, idempotent uploads, health
and the CLI's read-outs each hold a `Database` and name the statements they run, so a
reader finds every statement in SQL and every connection in this file.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool

from darkroom.db.connection import SESSION_OPTIONS, open_pool
from darkroom.db.queries import QUERIES

# What a lost connection or an unreachable server raises. The statement may or may not
# have committed: every write of the protocol is built to be repeated after one.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
# What PostgreSQL raises when it rolls a statement back to let others go on: to break a
# deadlock (statements that lock cards and owners' clocks in different orders, rare but
# possible when workers hand back leases the others took over), or a serialization
# failure. Such a statement did nothing; a statement sent alone is sent again, a few
# times, after a short jittered pause.
ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
ROLLED_BACK_TRIES = 5

Row = dict[str, Any]
Params = Mapping[str, Any]
T = TypeVar("T")


class Statements:
    """Named statements on one connection: the pool's (one statement, autocommitted) or
    a transaction's (`Database.transaction`)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def rows(self, name: str, params: Params | None = None) -> list[Row]:
        cur = await self._conn.execute(QUERIES[name], params or {}, prepare=True)
        return list(await cur.fetchall()) if cur.description else []

    async def row(self, name: str, params: Params | None = None) -> Row | None:
        rows = await self.rows(name, params)
        return rows[0] if rows else None

    async def typed(self, name: str, params: Params | None, cls: type[T]) -> list[T]:
        """Rows built into `cls` by column name (a dataclass whose fields are the columns)."""
        cur = self._conn.cursor(row_factory=class_row(cls))
        await cur.execute(QUERIES[name], params or {}, prepare=True)
        return list(await cur.fetchall())

    async def rowcount(self, name: str, params: Params | None = None) -> int:
        cur = await self._conn.execute(QUERIES[name], params or {}, prepare=True)
        return int(cur.rowcount)


class Database:
    """A pool and the named statements sent on it. Safe to share among one loop's tasks."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, conninfo: str, *, name: str, min_size: int = 1, max_size: int = 4,
                   fail_fast: bool = True, generic_plans: bool = False,
                   wait_seconds: float = 30.0) -> Database:
        """An opened database; with `fail_fast`, an unreachable server is psycopg's one-line
        error at once (long-running services pass False and wait for it); with
        `generic_plans`, the lease protocol's plan mode (connection.GENERIC_PLANS); a
        statement waits at most `wait_seconds` for a connection (psycopg_pool.PoolTimeout)."""
        return cls(await open_pool(conninfo, min_size=min_size, max_size=max_size,
                                   name=name, fail_fast=fail_fast, generic_plans=generic_plans,
                                   wait_seconds=wait_seconds))

    async def close(self, timeout: float = 5.0) -> None:
        """Close the pool, waiting at most `timeout` seconds for its background tasks (a
        connection being opened to a server that does not answer, say)."""
        await self.pool.close(timeout=timeout)

    @property
    def conninfo(self) -> str:
        conninfo = self.pool.conninfo
        assert isinstance(conninfo, str)  # every pool here is opened with a fixed one
        return conninfo

    @asynccontextmanager
    async def _statements(self) -> AsyncIterator[Statements]:
        async with self.pool.connection() as conn:
            yield Statements(conn)

    async def rows(self, name: str, params: Params | None = None) -> list[Row]:
        async def once() -> list[Row]:
            async with self._statements() as s:
                return await s.rows(name, params)
        return await _again_if_rolled_back(once)

    async def row(self, name: str, params: Params | None = None) -> Row | None:
        async def once() -> Row | None:
            async with self._statements() as s:
                return await s.row(name, params)
        return await _again_if_rolled_back(once)

    async def typed(self, name: str, params: Params | None, cls: type[T]) -> list[T]:
        async def once() -> list[T]:
            async with self._statements() as s:
                return await s.typed(name, params, cls)
        return await _again_if_rolled_back(once)

    async def rowcount(self, name: str, params: Params | None = None) -> int:
        async def once() -> int:
            async with self._statements() as s:
                return await s.rowcount(name, params)
        return await _again_if_rolled_back(once)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Statements]:
        """Several statements that commit together (or not at all)."""
        async with self.pool.connection() as conn, conn.transaction():
            yield Statements(conn)

    async def together(self, *statements: tuple[str, Params, type[Any] | None]
                       ) -> list[list[Any]]:
        """Named statements in one transaction, sent in one round trip (a pipeline): they
        commit together or not at all. Answers each one's rows, built into its class
        (dataclass by column name) where one is given, else dicts.

        The transaction is the pipeline's own: statements sent with no Sync between them
        run in one transaction that the Sync commits, and after an error the server skips
        the rest up to the Sync, so nothing of them commits (PostgreSQL's protocol,
        "Pipelining"). No BEGIN and no COMMIT of their own: two statements fewer for the
        server to run at every job."""
        return await _again_if_rolled_back(lambda: self._together(statements))

    async def _together(self, statements: tuple[tuple[str, Params, type[Any] | None], ...]
                        ) -> list[list[Any]]:
        async with self.pool.connection() as conn, conn.pipeline() as pipeline:
            if not conn.autocommit:
                # The driver would open a transaction of its own, left open past the Sync.
                raise RuntimeError("together() needs the pool's autocommitting connections")
            cursors = []
            for name, params, cls in statements:
                cur = conn.cursor(row_factory=class_row(cls)) if cls else conn.cursor()
                await cur.execute(QUERIES[name], params, prepare=True)
                cursors.append(cur)
            await pipeline.sync()
            return [list(await cur.fetchall()) for cur in cursors]

    async def ping(self, timeout: float) -> None:
        """One round trip within `timeout` seconds, for readiness checks."""
        async with self.pool.connection(timeout=timeout) as conn:
            await conn.execute(QUERIES["ping"])

    @asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[str]]:
        """`LISTEN channel` on a connection of its own (a listener holds its connection
        for as long as it waits); yields the notifications' payloads as they come.

        Notifications sent while no connection listened are lost: a listener treats
        entering this block as "something may have changed".
        """
        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                     **SESSION_OPTIONS)
        async with conn:
            await conn.execute(f"LISTEN {channel}")

            async def payloads() -> AsyncGenerator[str, None]:
                # A waiting `notifies()` holds the connection: it is closed before the
                # connection is, or leaving the block would wait on it for ever.
                notifies = conn.notifies()
                try:
                    async for notify in notifies:
                        yield notify.payload
                finally:
                    await notifies.aclose()

            gen = payloads()
            try:
                yield gen
            finally:
                await gen.aclose()


async def _again_if_rolled_back(call: Callable[[], Awaitable[T]]) -> T:
    """`call` (one statement, or one pipeline's transaction), sent again while PostgreSQL
    rolled it back to break a deadlock (ROLLED_BACK): each try did nothing."""
    attempt = 1
    while True:
        try:
            return await call()
        except ROLLED_BACK:
            if attempt == ROLLED_BACK_TRIES:
                raise
        await asyncio.sleep(random.uniform(0.0, 0.01 * 2 ** attempt))
        attempt += 1


@asynccontextmanager
async def opened(conninfo: str, *, name: str, max_size: int = 1,
                 fail_fast: bool = True) -> AsyncIterator[Database]:
    """A database for the length of a block: what one CLI command needs."""
    db = await Database.open(conninfo, name=name, max_size=max_size, fail_fast=fail_fast)
    try:
        yield db
    finally:
        await db.close()
