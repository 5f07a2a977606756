"""Plain SQL migrations, applied in file-name order, each once, under an advisory lock.

The lock makes two `darkroom migrate` (or two services starting at once) safe: the
second waits, then finds nothing left to apply.
"""

from __future__ import annotations

import logging
from importlib import resources

import psycopg

log = logging.getLogger("darkroom.migrations")

# Any fixed 64-bit number; it names "darkroom schema changes" among advisory locks.
_LOCK_KEY = 0x6461726B726F6F6D  # "darkroom"


def available() -> list[tuple[str, str]]:
    folder = resources.files("darkroom.db").joinpath("migrations")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in files]


def migrate(conninfo: str) -> list[str]:
    """Apply what is missing; answers the names applied by this call."""
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET lock_timeout = 0")
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS darkroom_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT name FROM darkroom_migrations")}
            for name, sql in available():
                if name in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO darkroom_migrations (name) VALUES (%s)", (name,))
                applied.append(name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    log.info("schema checked", extra={"applied": applied})
    return applied


def pending(conninfo: str) -> list[str]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('darkroom_migrations') IS NOT NULL").fetchone()
        done: set[str] = set()
        if exists and exists[0]:
            done = {row[0] for row in conn.execute("SELECT name FROM darkroom_migrations")}
    return [name for name, _ in available() if name not in done]
