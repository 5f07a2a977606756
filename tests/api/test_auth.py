"""Key lookups: cached briefly, so a revoked key stops working within the cache's time."""

from __future__ import annotations

from pathlib import Path

import psycopg

from darkroom.api.auth import KeyCache
from darkroom.db.queries import QUERIES
from darkroom.keys import Principal, hash_key
from tests.api.conftest import start_api
from tests.support.services import wait_for

ALICE = Principal(owner="alice", admin=False)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_for_the_ttl_only() -> None:
    clock = Clock()
    cache = KeyCache(5.0, clock=clock)
    cache.put("h", ALICE)
    clock.now += 4.9
    assert cache.get("h") == ALICE
    clock.now += 0.1
    assert cache.get("h") is None


def test_a_zero_ttl_caches_nothing() -> None:
    cache = KeyCache(0.0)
    cache.put("h", ALICE)
    assert cache.get("h") is None


def test_the_oldest_entries_go_first() -> None:
    cache = KeyCache(60.0, size=2)
    for h in ("a", "b", "c"):
        cache.put(h, ALICE)
    assert cache.get("a") is None and cache.get("b") == cache.get("c") == ALICE


def revoke(db_url: str, key: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(QUERIES["revoke_api_key"], {"key_hash": hash_key(key)})


def test_a_revoked_key_stops_working_within_the_cache_time(
    db_url: str, tmp_path: Path
) -> None:
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local",
                            key_cache_seconds=1.0)
    try:
        key = api.make_key()
        with api.client(key) as c:
            assert c.get("/v1/files").status_code == 200  # now cached
            revoke(db_url, key)
            wait_for(lambda: c.get("/v1/files").status_code == 401, timeout=10,
                     what="the revoked key to be refused")
    finally:
        server.stop()


def test_without_the_cache_revocation_is_immediate(db_url: str, tmp_path: Path) -> None:
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local",
                            key_cache_seconds=0)
    try:
        key = api.make_key()
        with api.client(key) as c:
            assert c.get("/v1/files").status_code == 200
            revoke(db_url, key)
            assert c.get("/v1/files").status_code == 401
    finally:
        server.stop()
