"""Real darkroom processes for the tests: started, signalled, frozen and killed like in life."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from hypothesis import settings
from psycopg.rows import dict_row

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.layout import (
    ATTEMPT_KEYS,
    ORIGINALS,
    derived_key,
    derived_prefix,
    parse_key,
    thumb_key,
)
from darkroom.queue import ConfirmOutcome, Queue
from darkroom.storage import ObjectStore
from tests.support.sql import SQL, Attempt

T = TypeVar("T")

# Real photographs, kept in the repository (corpus/README.md has their licence).
CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def corpus_photos(folder: Path = CORPUS) -> list[Path]:
    """The photographs in `folder` (its JPEGs and PNGs), in name order."""
    return sorted(p for p in folder.iterdir() if p.suffix in {".jpg", ".png"})


def examples(full: int) -> int:
    """How many Hypothesis examples a property test runs: `full`, or fewer when the loaded
    profile allows fewer (the `fast` profile of `make test-fast`, see tests/conftest.py)."""
    return min(full, settings().max_examples)


def _ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections (`ip_local_port_range`)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


_EPHEMERAL = _ephemeral_ports()
# Ports for the tests' servers: below the ephemeral range, so that no outgoing
# connection (a server's own, dialling a sibling it started a moment before) can take a
# port handed to a server that has not bound it yet; a server of several parts (SeaweedFS)
# otherwise fails to start now and then, more often the more test processes run.
_SERVER_PORTS = range(10_000, min(_EPHEMERAL.start, 30_000))


def free_port(avoid: Collection[int] = (), *, below: int | None = None) -> int:
    """A TCP port on loopback that nothing uses right now, outside the ephemeral range,
    and not one of `avoid` (the ports already handed to a server that has not bound them
    yet); below `below` when given."""
    top = min(below, _SERVER_PORTS.stop) if below is not None else _SERVER_PORTS.stop
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(_SERVER_PORTS.start, top)
        if port in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def small_photos(count: int) -> list[bytes]:
    """`count` distinct small JPEGs cut from the corpus: real photographs, quick to derive."""
    import pyvips

    sources = sorted(CORPUS.glob("*.jpg"))
    out = []
    for i in range(count):
        image = pyvips.Image.thumbnail(str(sources[i % len(sources)]), 96 + i % 97)
        out.append(image.write_to_buffer(".jpg[Q=80]"))
    return out


def wait_for(check: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.05,
              what: str = "condition") -> T:
    """Poll `check` until it answers something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


async def wait_until(check: Callable[[], bool], *, timeout: float = 30.0,
                     what: str = "condition") -> None:
    """`wait_for` on the event loop: yields to it between looks, fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)


def wait_past_guard(db_url: str, guard_seconds: float, *, timeout: float = 120.0) -> None:
    """Until every orphan and every deleted card is older than the sweeper's guard interval
    by the database's clock (the one the sweeper judges by), so one sweep takes them all."""
    def past() -> bool:
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(SQL["past_guard"], {"g": float(guard_seconds)}).fetchone()
        return bool(row and row[0])

    wait_for(past, timeout=timeout, interval=0.25, what="the guard interval to pass")


def sweepable_orphans(db_url: str) -> list[tuple[str, uuid.UUID]]:
    """Every key the orphan sweep holds, with the token of the attempt it names: the
    attempts that ended unpublished filled in first, as the sweep's pass does."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(QUERIES["sweep_unpublished_attempts"],
                     {"limit": 1_000_000, "attempt_keys": list(ATTEMPT_KEYS)})
        return [(key, token) for key, token in conn.execute(SQL["orphan_tokens"])]


class DarkroomProcess:
    """One `darkroom …` subprocess with its own log file.

    Every one is stopped when the test process exits, however it exits (a failed
    assertion, a timeout, a Ctrl-C), so a run never leaves a worker or an API behind.
    """

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path,
                 module: str = "darkroom.cli") -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        _running.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        """Kill the whole group, decoder children included, as a machine crash would."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with_suppress(lambda: os.killpg(self.proc.pid, signal.SIGCONT))
            with_suppress(lambda: os.killpg(self.proc.pid, signal.SIGKILL))
            self.proc.wait(timeout=30)
        self._log.close()
        _running.discard(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


_running: set[DarkroomProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    for proc in list(_running):
        proc.stop()


def with_suppress(call: Callable[[], Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        call()


class Harness:
    """A database, a store, and the processes of one test."""

    def __init__(self, db_url: str, store: ObjectStore, storage_url: str, tmp: Path,
                 extra_env: dict[str, str] | None = None) -> None:
        self.db_url = db_url
        self.store = store
        self.tmp = tmp
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
            "DARKROOM_DATABASE_URL": db_url,
            "DARKROOM_STORAGE_URL": storage_url,
            "DARKROOM_DATA_DIR": str(tmp / "data"),
            "DARKROOM_LEASE_SECONDS": "2",
            "DARKROOM_MAX_ATTEMPTS": "3",
            "DARKROOM_RETRY_BASE_SECONDS": "0.2",
            "DARKROOM_RETRY_CAP_SECONDS": "1",
            "DARKROOM_POLL_SECONDS": "0.5",
            "DARKROOM_SWEEP_GUARD_SECONDS": "0",
            **(extra_env or {}),
        }
        self.processes: list[DarkroomProcess] = []
        self.db = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)

    def start(self, *args: str, env: dict[str, str] | None = None,
              child: tuple[str, ...] = ()) -> DarkroomProcess:
        name = f"{args[0]}-{len(self.processes)}"
        if child:  # a test's decoder child (tests/support/child_worker.py)
            args = (*child, "--", *args)
        proc = DarkroomProcess(list(args), {**self.env, **(env or {})},
                               self.tmp / f"{name}.log",
                               "tests.support.child_worker" if child else "darkroom.cli")
        self.processes.append(proc)
        return proc

    def worker(self, concurrency: int = 2, child: tuple[str, ...] = (),
               **env: str) -> DarkroomProcess:
        """A worker; `child` names a test decoder child (hostile_child.py) and its args."""
        name = f"w{len(self.processes)}"
        return self.start("worker", "--concurrency", str(concurrency), "--name", name,
                          env={f"DARKROOM_{k.upper()}": v for k, v in env.items()},
                          child=child)

    def close(self) -> None:
        for proc in self.processes:
            proc.stop()
        self.db.close()

    # --- cards ------------------------------------------------------------------------

    def _with_queue(self, call: Callable[[Queue], Awaitable[T]]) -> T:
        """Run one protocol call, as the API would make it, on a short-lived pool."""
        async def go() -> T:
            pool = await open_pool(self.db_url, min_size=1, max_size=1)
            try:
                return await call(Queue(Database(pool), lease_seconds=2, max_attempts=3,
                                        retry_base_seconds=0, retry_cap_seconds=0))
            finally:
                await pool.close()

        return asyncio.run(go())

    def upload(self, data: bytes, owner: str = "tester", name: str = "photo.jpg") -> uuid.UUID:
        """What the API does on upload + confirm, through the protocol module itself."""
        async def go(q: Queue) -> uuid.UUID:
            card = await q.create_file(owner=owner, filename=name, content_type="image/jpeg",
                                       size=len(data))
            version = await asyncio.to_thread(self.store.put, card.original_key, data,
                                              content_type="image/jpeg")
            assert await confirm(q, card.id, owner, version) is ConfirmOutcome.QUEUED
            return card.id

        return self._with_queue(go)

    def upload_many(self, photos: list[bytes], owner: str = "tester") -> list[uuid.UUID]:
        """`upload` for many photos over one connection pool."""
        async def go(q: Queue) -> list[uuid.UUID]:
            ids = []
            for i, data in enumerate(photos):
                card = await q.create_file(owner=owner, filename=f"p{i}.jpg",
                                           content_type="image/jpeg", size=len(data))
                version = await asyncio.to_thread(self.store.put, card.original_key, data,
                                                  content_type="image/jpeg")
                assert await confirm(q, card.id, owner, version) is ConfirmOutcome.QUEUED
                ids.append(card.id)
            return ids

        return self._with_queue(go)

    def revoke(self, file_id: uuid.UUID, owner: str = "tester") -> None:
        async def go(q: Queue) -> bool:
            return await q.revoke(file_id, owner)

        assert self._with_queue(go)

    def reconnect(self) -> bool:
        """After a server restart: a new connection for the test's own queries."""
        try:
            self.db.execute(QUERIES["ping"])
        except psycopg.OperationalError:
            self.db.close()
            self.db = psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)
        return True

    def value(self, name: str, params: dict[str, Any] | None = None) -> Any:
        """The first column of the one row of a test statement (tests/support/queries.sql)."""
        row = self.db.execute(SQL[name], params).fetchone()
        assert row is not None, name
        return next(iter(row.values()))

    def card(self, file_id: uuid.UUID) -> dict[str, Any]:
        row = self.db.execute(SQL["card"], {"id": file_id}).fetchone()
        assert row is not None, f"no card {file_id}"
        return row

    def statuses(self, ids: list[uuid.UUID]) -> dict[str, int]:
        rows = self.db.execute(SQL["status_counts_among"], {"ids": ids}).fetchall()
        return {r["status"]: r["n"] for r in rows}

    def all_finished(self, ids: list[uuid.UUID]) -> bool:
        s = self.statuses(ids)
        return s.get("ready", 0) + s.get("rejected", 0) == len(ids)

    def events(self, file_id: uuid.UUID | None = None, kind: str | None = None
               ) -> list[dict[str, Any]]:
        return self.db.execute(SQL["events"], {"id": file_id, "kind": kind}).fetchall()

    def assert_published_once(self, file_id: uuid.UUID) -> None:
        card = self.card(file_id)
        assert card["status"] == "ready", card
        ready = self.events(file_id, "ready")
        assert len(ready) == 1, ready
        attempt = Attempt(file_id, ready[0]["token"])
        assert card["derived_key"] == derived_key(attempt)
        data = self.store.get(card["derived_key"], card["derived_version"])
        assert hashlib.sha256(data).hexdigest() == card["sha256"]
        assert len(data) == card["derived_bytes"]
        assert data[:4] == b"RIFF" and data[8:12] == b"WEBP"
        # The thumb was published by the same commit, from the same attempt.
        assert card["thumb_key"] == thumb_key(attempt)
        thumb = self.store.get(card["thumb_key"], card["thumb_version"])
        assert hashlib.sha256(thumb).hexdigest() == card["thumb_sha256"]
        assert max(card["thumb_width"], card["thumb_height"]) <= 400
        assert card["thumbhash"] and len(card["thumbhash"]) <= 40

    def object_keys(self, file_id: uuid.UUID) -> list[str]:
        originals = [o for o in self.store.list(ORIGINALS)
                     if (p := parse_key(o.key)) is not None and p.file_id == file_id]
        return sorted(f"{o.key}@{o.version}" for o in
                      [*originals, *self.store.list(derived_prefix(file_id))])

async def confirm(queue: Queue, file_id: uuid.UUID, owner: str, version: str) -> ConfirmOutcome:
    """pending -> queued for `version`, as a confirm without a digest: the outcome alone."""
    return (await queue.confirm_card(file_id, owner, version)).outcome


def make_queue(pool: Any, **overrides: Any) -> Queue:
    options: dict[str, Any] = {
        "lease_seconds": 30.0, "max_attempts": 3,
        "retry_base_seconds": 0.0, "retry_cap_seconds": 0.0, "worker": "test",
    }
    options.update(overrides)
    return Queue(Database(pool), **options)
