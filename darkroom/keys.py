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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.database import Database, opened
from darkroom.db.migrations import migrate

T = TypeVar("T")

KEY_PREFIX = "dk_"
MAX_OWNER_LENGTH = 200
_NAME_LENGTH = len(KEY_PREFIX) + 9
# A name given to `keys revoke` must be at least this long, so a slip cannot match many.
_MIN_REVOKE_NAME = len(KEY_PREFIX) + 4


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for."""

    owner: str
    admin: bool


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_name(key: str) -> str:
    """What `darkroom keys list` shows of a key: enough to tell keys apart, far too little
    to use one."""
    return key[:_NAME_LENGTH]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def validate_owner(owner: str) -> str:
    owner = owner.strip()
    if not owner or len(owner) > MAX_OWNER_LENGTH:
        raise ConfigError(f"--owner must be 1 to {MAX_OWNER_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in owner):
        raise ConfigError("--owner must not contain control characters")
    return owner


async def create_key(db: Database, owner: str, admin: bool = False) -> str:
    """Store a new key for `owner` and answer it; this is the only time it is known."""
    owner = validate_owner(owner)
    key = new_key()
    await db.rows("create_api_key", {"key_hash": hash_key(key), "owner": owner,
                                     "admin": admin, "key_prefix": key_name(key)})
    return key


async def find_key(db: Database, key: str) -> Principal | None:
    return await find_key_hash(db, hash_key(key))


async def find_key_hash(db: Database, key_hash: str) -> Principal | None:
    row = await db.row("find_api_key", {"key_hash": key_hash})
    if row is None:
        return None
    return Principal(owner=str(row["owner"]), admin=bool(row["admin"]))


async def _with_database(url: str, body: Callable[[Database], Awaitable[T]]) -> T:
    async with opened(url, name="keys") as db:
        return await body(db)


async def create_key_at(conninfo: str, owner: str, admin: bool = False) -> str:
    """`create_key` on a database of its own, for one command."""
    return await _with_database(conninfo, lambda db: create_key(db, owner, admin))


async def _revoke(db: Database, name: str | None, owner: str | None) -> list[dict[str, Any]]:
    if name is not None:
        matches = await db.rows("match_api_keys", {"name": name})
        if len(matches) > 1:
            shown = ", ".join(str(m["name"]) for m in matches)
            raise ConfigError(f"{name!r} matches {len(matches)} keys ({shown}); give more")
    return await db.rows("revoke_api_keys", {"name": name, "owner": owner})


def create_key_cli(settings: Settings, *, owner: str, admin: bool) -> int:
    """`darkroom keys create`: the key on stdout (alone, for scripts), a note on stderr."""
    owner = validate_owner(owner)
    url = database_url(settings)
    migrate(url)  # a fresh database gets its tables; safe to run concurrently
    key = asyncio.run(create_key_at(url, owner, admin))
    print(key)
    role = "admin key" if admin else "key"
    print(f"darkroom: new {role} for owner {owner!r}; it is shown only this once", file=sys.stderr)
    return 0


def list_keys_cli(settings: Settings, *, owner: str | None, all_keys: bool) -> int:
    """`darkroom keys list`: one line per key, never a usable key."""
    url = database_url(settings)
    migrate(url)
    rows = asyncio.run(_with_database(
        url, lambda db: db.rows("list_api_keys", {"owner": owner, "all": all_keys})))
    for row in rows:
        state = f"revoked {row['revoked_at']:%Y-%m-%d %H:%M}" if row["revoked_at"] else "active"
        role = "admin" if row["admin"] else "-"
        print(f"{row['name']}\t{row['owner']}\t{role}\t"
              f"created {row['created_at']:%Y-%m-%d %H:%M}\t{state}")
    if not rows:
        print("darkroom: no keys", file=sys.stderr)
    return 0


def revoke_keys_cli(settings: Settings, *, name: str | None, owner: str | None) -> int:
    """`darkroom keys revoke KEY_PREFIX | --owner O`: exactly one key, or all of an owner's.

    Each API process stops accepting a revoked key within DARKROOM_KEY_CACHE_SECONDS.
    """
    if (name is None) == (owner is None):
        raise ConfigError("give either a key's prefix (from `darkroom keys list`) or --owner")
    if name is not None:
        name = name.strip()
        if len(name) < _MIN_REVOKE_NAME:
            raise ConfigError(f"the key prefix must be at least {_MIN_REVOKE_NAME} characters")
    url = database_url(settings)
    migrate(url)
    rows = asyncio.run(_with_database(url, lambda db: _revoke(db, name, owner)))
    for row in rows:
        print(f"revoked {row['name']} (owner {row['owner']!r})")
    if not rows:
        print("darkroom: no active key matched; nothing revoked", file=sys.stderr)
        return 1
    return 0
