"""Many processes claim from one table at once: every row is started exactly once."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.layout import original_key
from darkroom.queue import Derived, Queue, derived_key
from tests.support.sql import SQL

# A fleet of real processes: not in `make test-fast`.
pytestmark = pytest.mark.fleet

ROWS = 5_000
PROCESSES = 8


def seed_queued(db_url: str, n: int) -> None:
    ids = [uuid.uuid4() for _ in range(n)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["seed_queued"], {"owner": "load", "ids": ids,
                                          "keys": [original_key(i, "load") for i in ids]})


async def _drain(db_url: str, name: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = await open_pool(db_url, min_size=1, max_size=2)
    queue = Queue(Database(pool), lease_seconds=300, max_attempts=3, retry_base_seconds=1,
                  retry_cap_seconds=1, worker=name)
    started: list[str] = []
    try:
        while True:
            leases = await queue.claim(rng.randint(1, 16))
            if not leases:
                break
            started.extend(str(lease.file_id) for lease in leases)
            lost = await queue.complete_many([
                (lease, Derived(derived_key(lease), "v", "0" * 64, 1, 1, 1))
                for lease in leases])
            assert not lost
    finally:
        await pool.close()
    return started


def drain(args: tuple[str, str, int]) -> list[str]:
    return asyncio.run(_drain(*args))


def test_eight_processes_start_every_row_exactly_once(db_url: str) -> None:
    seed_queued(db_url, ROWS)
    ctx = mp.get_context("spawn")
    with ctx.Pool(PROCESSES) as procs:
        results = procs.map(drain, [(db_url, f"w{i}", i) for i in range(PROCESSES)])
    started = Counter(fid for result in results for fid in result)
    assert len(started) == ROWS
    assert set(started.values()) == {1}
    assert sum(1 for r in results if r) >= 2  # the work really was shared
    with psycopg.connect(db_url) as conn:
        status: dict[str, int] = dict(conn.execute(SQL["status_counts"]).fetchall())
        claims = conn.execute(SQL["claim_counts"]).fetchone()
    assert status == {"ready": ROWS}
    assert claims == (ROWS, ROWS)


def test_two_concurrent_migrations_both_succeed(empty_db_url: str) -> None:
    cmd = [sys.executable, "-m", "darkroom.cli", "migrate"]
    env: dict[str, Any] = {"DARKROOM_DATABASE_URL": empty_db_url, "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    with psycopg.connect(empty_db_url) as conn:
        names = [r[0] for r in conn.execute(SQL["applied_migrations"])]
        assert conn.execute(SQL["queue_table_exists"]).fetchone() == (True,)
    assert len(names) == len(set(names)) >= 1
