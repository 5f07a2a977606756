"""The failover rehearsal: darkroom under load on a primary and a streaming standby, the
primary killed (`kill -9`) mid-run and the standby promoted, every process given both
hosts with `target_session_attrs=read-write` and never restarted.

`tests/chaos/test_failover.py` runs it reduced (synchronous replication); `bench/failover.py`
runs it full size, synchronous and asynchronous, and writes docs/BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from darkroom.layout import ORIGINALS, parse_key
from darkroom.storage import ObjectStore, open_store
from tests.support.replica import ReplicatedPostgres
from tests.support.services import DarkroomProcess, free_port, small_photos, wait_for
from tests.support.sql import SQL

LEASE = 3.0
MAX_ATTEMPTS = 5
GUARD = 3.0
# Short, so that a confirm the failover lost is found by the sweeper within the run.
PENDING_TTL = 20.0
# The kill comes once this share of the files has been confirmed.
KILL_AT = 0.4
# Before the kill the replication link stalls this long, as a congested or partitioned
# network leaves a standby behind: asynchronous commits made meanwhile never reach it,
# synchronous ones wait for it.
LAG = 2.0
# How long the operator takes to promote the standby after the primary died.
PROMOTE_AFTER = 1.0
OWNER = "failover"


class System:
    """The API, a sweeper and the workers, each a process given the pair's host list."""

    def __init__(self, tmp: Path, pg: ReplicatedPostgres, workers: int) -> None:
        self.tmp = tmp
        self.pg = pg
        self.storage_url = (tmp / "objects").as_uri()
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
            "DARKROOM_DATABASE_URL": pg.url,
            "DARKROOM_STORAGE_URL": self.storage_url,
            "DARKROOM_DATA_DIR": str(tmp / "data"),
            "DARKROOM_LEASE_SECONDS": str(LEASE),
            "DARKROOM_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "DARKROOM_RETRY_BASE_SECONDS": "0.5",
            "DARKROOM_RETRY_CAP_SECONDS": "4",
            "DARKROOM_POLL_SECONDS": "2",
            "DARKROOM_SWEEP_GUARD_SECONDS": str(GUARD),
            "DARKROOM_SWEEP_INTERVAL_SECONDS": "2",
            "DARKROOM_PENDING_TTL_SECONDS": str(PENDING_TTL),
            "DARKROOM_SHUTDOWN_GRACE_SECONDS": "5",
        }
        self.n = 0
        self.key = self.cli("keys", "create", "--owner", OWNER).stdout.strip()
        self.api = self.start("api", "--port", str(self.port))
        self.sweeper = self.start("sweep")
        self.workers = [self.start("worker", "--concurrency", "2", "--name", f"w{i}")
                        for i in range(workers)]
        wait_for(self.api_ready, timeout=60, what="the API")
        self.store: ObjectStore = open_store(self.storage_url)

    def start(self, *args: str) -> DarkroomProcess:
        self.n += 1
        return DarkroomProcess(list(args), self.env, self.tmp / f"{self.n:03d}-{args[0]}.log")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "darkroom.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def api_ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> list[str]:
        """The processes that died (none may: they follow the failover by themselves)."""
        return [p.log_path.name for p in [self.api, self.sweeper, *self.workers]
                if p.proc.poll() is not None]

    def stop(self) -> None:
        for proc in [self.api, self.sweeper, *self.workers]:
            proc.stop()


class Client:
    """A user's client: create, upload, confirm, retrying what an outage interrupts."""

    def __init__(self, system: System) -> None:
        self.base = system.api_url
        self.http = httpx.Client(base_url=self.base, timeout=15,
                                 headers={"Authorization": f"Bearer {system.key}"})

    def _retry(self, call: Any, ok: tuple[int, ...]) -> httpx.Response:
        delay = 0.2
        for _ in range(80):
            try:
                response: httpx.Response = call()
                if response.status_code in ok or response.status_code < 500:
                    return response
            except httpx.TransportError:
                pass
            time.sleep(delay)  # a client's backoff, not a wait for a state
            delay = min(delay * 1.5, 2.0)
        raise RuntimeError("gave up after an outage longer than the client's patience")

    def create(self, data: bytes) -> uuid.UUID:
        r = self._retry(lambda: self.http.post("/v1/files", json={
            "filename": "photo.jpg", "content_type": "image/jpeg", "size": len(data)}), (201,))
        assert r.status_code == 201, r.text
        return uuid.UUID(r.json()["id"])

    def put(self, file_id: uuid.UUID, data: bytes) -> str | None:
        """The stored version, or None when the card is gone (its create was lost)."""
        r = self._retry(lambda: self.http.put(f"/v1/files/{file_id}/content", content=data,
                                              headers={"Content-Type": "image/jpeg"}),
                        (200,))
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        return str(r.json()["version"])

    def confirm(self, file_id: uuid.UUID, version: str) -> bool:
        """True on 202; False when the card is gone (its create was lost)."""
        r = self._retry(lambda: self.http.post(f"/v1/files/{file_id}/confirm",
                                               json={"version": version}), (202,))
        if r.status_code == 404:
            return False
        assert r.status_code == 202, r.text
        return True


@dataclass
class Outcome:
    synchronous: bool
    files: int
    acked: int = 0  # confirms answered 202
    stored: int = 0  # uploads the store holds (answered 200)
    kill_after_seconds: float = 0.0
    reconnect_seconds: float = 0.0  # from the kill to the first card that moved after it
    # What the promoted standby lacked at promotion: the asynchronous replication's loss.
    lost_acked_confirms: int = 0
    lost_creates: int = 0
    lost_published: int = 0
    ready_before_kill: int = 0
    # How they were recovered: the pending sweep, and `darkroom reconcile --restore`.
    upload_found: int = 0
    restored: int = 0
    originals_deleted: int = 0
    # The page's event stream, opened before the kill and never reopened: a resync once
    # the API's LISTEN reconnected, then the status changes made on the new primary.
    stream_resynced: bool = False
    stream_events_after_kill: int = 0
    max_starts: int = 0
    total_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run(files: int, *, synchronous: bool, tmp: Path, workers: int = 3) -> Outcome:
    started = time.monotonic()
    pg = ReplicatedPostgres(synchronous=synchronous)
    outcome = Outcome(synchronous=synchronous, files=files)
    system: System | None = None
    try:
        system = System(tmp, pg, workers)
        _rehearse(system, pg, outcome, small_photos(files))
    finally:
        if system is not None:
            system.stop()
        pg.stop()
    outcome.total_seconds = round(time.monotonic() - started, 1)
    return outcome


def _rehearse(system: System, pg: ReplicatedPostgres, outcome: Outcome,
              photos: list[bytes]) -> None:
    client = Client(system)
    acked: dict[uuid.UUID, str] = {}
    stored: dict[uuid.UUID, str] = {}
    created: set[uuid.UUID] = set()
    lock = threading.Lock()
    enough = threading.Event()
    ready_seen: set[uuid.UUID] = set()
    t0 = time.monotonic()

    def one(data: bytes) -> None:
        file_id = client.create(data)
        with lock:
            created.add(file_id)
        version = client.put(file_id, data)
        if version is None:
            return
        with lock:
            stored[file_id] = version
        if client.confirm(file_id, version):
            with lock:
                acked[file_id] = version
                if len(acked) >= KILL_AT * len(photos):
                    enough.set()

    def watch_ready(stop: threading.Event) -> None:
        """The ready cards the primary shows, read until it dies: what was published."""
        with contextlib.suppress(psycopg.Error), psycopg.connect(
                pg.host_url(0), autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(SQL["ready_ids"])
                ready_seen.update(r[0] for r in rows.fetchall())
                stop.wait(0.05)

    def failover() -> None:
        enough.wait(600)
        pg.link.stall()
        time.sleep(LAG)  # the scenario's lag, not a wait for a state
        with lock:
            acked_before = dict(acked)
            created_before = set(created)
        pg.kill_primary()
        killed = time.monotonic()
        killed_at.append(killed)
        # What the stalled link still held dies with the primary's machine.
        pg.link.reset()
        outcome.kill_after_seconds = round(killed - t0, 1)
        time.sleep(PROMOTE_AFTER)  # the operator's reaction time, part of the scenario
        pg.promote()
        # What the new primary holds of what the old one acknowledged, before any
        # darkroom process can change it (the pending sweep waits for the TTL).
        with psycopg.connect(pg.primary_url, autocommit=True, row_factory=dict_row) as conn:
            cards = {r["id"]: r["status"] for r in conn.execute(
                SQL["statuses_among"], {"ids": list(created_before)}).fetchall()}
            outcome.lost_acked_confirms = sum(
                1 for i in acked_before if cards.get(i, "pending") == "pending")
            outcome.lost_creates = sum(1 for i in created_before if i not in cards)
            outcome.lost_published = sum(1 for i in ready_seen if cards.get(i) != "ready")
            outcome.ready_before_kill = len(ready_seen)

            last = conn.execute(SQL["last_event"]).fetchone()

            def moved() -> bool:
                row = conn.execute(SQL["moves_after"],
                                   {"after": last["m"] if last else 0}).fetchone()
                return bool(row and row["n"])

            wait_for(moved, timeout=120, interval=0.1, what="work after the failover")
            outcome.reconnect_seconds = round(time.monotonic() - killed, 1)

    killed_at: list[float] = []

    def watch_stream(stop: threading.Event) -> None:
        """One page's event stream, across the failover."""
        with contextlib.suppress(httpx.HTTPError), client.http.stream(
                "GET", "/v1/events", timeout=httpx.Timeout(15, read=60)) as r:
            for line in r.iter_lines():
                if stop.is_set():
                    return
                if not killed_at or not line.startswith("event: "):
                    continue
                if line == "event: resync":
                    outcome.stream_resynced = True
                elif line == "event: status" and outcome.stream_resynced:
                    outcome.stream_events_after_kill += 1

    stop_watch, stop_stream = threading.Event(), threading.Event()
    watcher = threading.Thread(target=watch_ready, args=(stop_watch,))
    streamer = threading.Thread(target=watch_stream, args=(stop_stream,), daemon=True)
    streamer.start()
    killer = threading.Thread(target=failover)
    watcher.start()
    killer.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(one, photos))
    finally:
        enough.set()
        killer.join()
        stop_watch.set()
        watcher.join()
    outcome.acked, outcome.stored = len(acked), len(stored)
    db = psycopg.connect(pg.primary_url, autocommit=True, row_factory=dict_row)
    try:
        _recover_and_verify(system, db, outcome, acked, stored)
    finally:
        db.close()

    # The open stream's side of the failover. The API's listener finds the new primary
    # after a backoff, so its resync can come after the last card settled: one more upload
    # makes changes on the new primary for the stream to show once it has.
    def followed() -> bool:
        return outcome.stream_resynced and outcome.stream_events_after_kill > 0

    if not followed():
        file_id = client.create(photos[0])
        version = client.put(file_id, photos[0])
        if version is not None:
            client.confirm(file_id, version)
    try:
        # A stream that never follows is the outcome's to report (the caller asserts it).
        with contextlib.suppress(AssertionError):
            wait_for(followed, timeout=60, interval=0.1, what="the stream to follow")
    finally:
        stop_stream.set()


def _statuses(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    rows = db.execute(SQL["statuses_among"], {"ids": ids}).fetchall()
    return {r["id"]: r["status"] for r in rows}


def _recover_and_verify(system: System, db: psycopg.Connection[Any], outcome: Outcome,
                        acked: dict[uuid.UUID, str], stored: dict[uuid.UUID, str]) -> None:
    problems = outcome.problems
    settled = {"ready", "rejected"}
    # Every acknowledged confirm ends settled. (A confirm the failover lost comes back
    # through the pending sweep once its card's TTL passes.)
    present = list(_statuses(db, list(stored)))
    wait_for(lambda: set(_statuses(db, present).values()) <= settled, timeout=300,
             interval=0.5, what="every card to settle")
    # Uploads whose card the failover lost: reconcile keeps them, --restore makes cards.
    wait_for(lambda: _past_guard(db), timeout=120, interval=0.25, what="the guard interval")
    restore = system.cli("reconcile", "--restore")
    outcome.restored = sum(1 for line in restore.stdout.splitlines()
                           if line.startswith("restored "))
    wait_for(lambda: set(_statuses(db, list(stored)).values()) <= settled, timeout=300,
             interval=0.5, what="every restored card to settle")
    wait_for(lambda: _past_guard(db), timeout=120, interval=0.25, what="the guard interval")
    sweep = system.start("sweep", "--once")
    assert sweep.wait(300) == 0, sweep.log()
    reconcile = system.cli("reconcile")
    if "originals kept: 0," not in reconcile.stdout.strip().splitlines()[-1]:
        problems.append(f"reconcile: {reconcile.stdout.strip().splitlines()[-1]}")
    if dead := system.alive():
        problems.append(f"processes died: {dead}")

    cards = {r["id"]: r for r in db.execute(SQL["cards"]).fetchall()}
    events = db.execute(SQL["events"], {"id": None, "kind": None}).fetchall()
    outcome.upload_found = sum(1 for e in events if e["kind"] == "upload_found")
    for file_id in acked if outcome.synchronous else stored:
        card = cards.get(file_id)
        if card is None or card["status"] != "ready":
            problems.append(f"{file_id}: ended {card['status'] if card else 'without a card'}")
            continue
        data = system.store.get(card["derived_key"], card["derived_version"])
        if hashlib.sha256(data).hexdigest() != card["sha256"]:
            problems.append(f"{file_id}: derivative does not match its sha256")
    claims = Counter(e["file_id"] for e in events if e["kind"] == "claimed")
    claims.subtract(Counter(e["file_id"] for e in events if e["kind"] == "deferred"))
    outcome.max_starts = max(claims.values()) if claims else 0
    if outcome.max_starts > MAX_ATTEMPTS:
        problems.append(f"a file was started {outcome.max_starts} times")
    # No original a user stored is gone: every upload's version is still in the store.
    listed = system.store.list(ORIGINALS)
    objects = {(p.file_id, o.version) for o in listed if (p := parse_key(o.key)) is not None}
    outcome.originals_deleted = sum(1 for i, v in stored.items() if (i, v) not in objects)
    if outcome.originals_deleted:
        problems.append(f"{outcome.originals_deleted} stored originals deleted")
    wanted = set()
    for card in cards.values():
        if card["status"] == "pending":
            continue
        wanted.add((card["original_key"], card["original_version"]))
        if card["status"] == "ready":
            wanted.add((card["derived_key"], card["derived_version"]))
            if card["thumb_key"]:
                wanted.add((card["thumb_key"], card["thumb_version"]))
    stored_keys = {(o.key, o.version) for o in listed}  # by key: the layout names the owner
    if stored_keys - wanted:
        problems.append(f"{len(stored_keys - wanted)} objects no card accounts for")


def _past_guard(db: psycopg.Connection[Any]) -> bool:
    row = db.execute(SQL["quiet_for"], {"g": GUARD}).fetchone()
    return bool(row and row["past"])
