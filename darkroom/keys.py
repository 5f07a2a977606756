"""API keys: random bearer tokens, stored only as hashes, each bound to one owner.

A key is `dk_` followed by 32 random bytes (URL-safe base64). Only its sha256 is stored.
A plain, unsalted, fast hash is the right tool here and not a password hash: the key has
256 bits of entropy, so neither a dictionary nor brute force against a leaked hash is
feasible, and a fast hash lets every request find its key with one indexed lookup. Since
the lookup is by hash, there is no secret comparison in Python to time.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import sys
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES

KEY_PREFIX = "dk_"
MAX_OWNER_LENGTH = 200


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for."""

    owner: str
    admin: bool


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def validate_owner(owner: str) -> str:
    owner = owner.strip()
    if not owner or len(owner) > MAX_OWNER_LENGTH:
        raise ConfigError(f"--owner must be 1 to {MAX_OWNER_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in owner):
        raise ConfigError("--owner must not contain control characters")
    return owner


async def create_key(
    pool_or_conninfo: AsyncConnectionPool[Any] | str, owner: str, admin: bool = False
) -> str:
    """Store a new key for `owner` and answer it; this is the only time it is known."""
    owner = validate_owner(owner)
    key = new_key()
    params = {"key_hash": hash_key(key), "owner": owner, "admin": admin}
    if isinstance(pool_or_conninfo, str):
        async with await psycopg.AsyncConnection.connect(pool_or_conninfo, autocommit=True) as conn:
            await conn.execute(QUERIES["create_api_key"], params)
    else:
        async with pool_or_conninfo.connection() as conn:
            await conn.execute(QUERIES["create_api_key"], params)
    return key


async def find_key(pool: AsyncConnectionPool[Any], key: str) -> Principal | None:
    async with pool.connection() as conn:
        cur = await conn.execute(QUERIES["find_api_key"], {"key_hash": hash_key(key)}, prepare=True)
        row = await cur.fetchone()
    if row is None:
        return None
    return Principal(owner=str(row["owner"]), admin=bool(row["admin"]))


def create_key_cli(settings: Settings, *, owner: str, admin: bool) -> int:
    """`darkroom keys create`: the key on stdout (alone, for scripts), a note on stderr."""
    owner = validate_owner(owner)
    url = database_url(settings)
    migrate(url)  # a fresh database gets its tables; safe to run concurrently
    key = asyncio.run(create_key(url, owner, admin))
    print(key)
    role = "admin key" if admin else "key"
    print(f"darkroom: new {role} for owner {owner!r}; it is shown only this once", file=sys.stderr)
    return 0
