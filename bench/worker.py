"""End-to-end worker throughput against the pipeline alone, and idle confirm -> start latency.

    .venv/bin/python -m bench.worker [--images 36] [--latency-samples 40]

(Run as a module: as a script, bench/ would be on sys.path and bench/queue.py would
shadow the standard library's `queue`.)

Everything runs in one go on one machine: a private PostgreSQL (the pgserver wheel), the
local object store in a temp dir, real `darkroom worker` processes. For each parallelism
p in (1, 2) it measures
- the pipeline alone: the corpus through p sandboxed decoder children, no queue, no store;
- end to end: the same images confirmed at once to an idle worker with p slots, timed
  from the confirm until the last card is `ready` (claim, fetch, derive, PUT, fenced
  commit, heartbeats and all);
and then the confirm -> processing-start latency of single files on an idle worker,
both timestamps taken from the database's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import machine
from bench.results import WorkerLatency, WorkerResult, WorkerSlots
from bench.runs import command
from bench.sections import publish
from bench.sql import SQL, composed
from bench.stats import percentile
from darkroom.config import load_settings
from darkroom.db import embedded
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.migrations import migrate
from darkroom.derive import Limits
from darkroom.queue import ConfirmOutcome, Queue
from darkroom.sandbox import DecoderProcess
from darkroom.storage import open_store
from tests.support.services import corpus_photos
from tests.support.sql import SQL as TEST_SQL

ROOT = Path(__file__).resolve().parents[1]


def corpus(n: int) -> list[bytes]:
    files = corpus_photos()
    return [files[i % len(files)].read_bytes() for i in range(n)]


def pipeline_alone(images: list[bytes], parallel: int) -> float:
    """Images per second through `parallel` decoder children fed from threads."""
    limits = Limits.from_settings(load_settings())
    decoders = [DecoderProcess(limits, timeout=120, memory_mb=1024) for _ in range(parallel)]
    for d in decoders:
        d.start()
        d.derive(images[0])  # warm: the child has imported libvips
    todo = list(range(len(images)))
    lock = threading.Lock()

    def run(decoder: DecoderProcess) -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            decoder.derive(images[i])

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(d,)) for d in decoders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for d in decoders:
        d.close()
    return len(images) / elapsed


class System:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        base = Path(tempfile.mkdtemp(prefix="darkroom-bench-pg-"))
        self.server_url = embedded.url(base / "pg", stop_on_exit=True)
        self.n = 0

    def fresh(self) -> tuple[str, str]:
        self.n += 1
        name = f"bench_worker_{self.n}"
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(composed("drop_database", name=name))
            conn.execute(composed("create_database", name=name))
        url = psycopg.conninfo.make_conninfo(self.server_url, dbname=name)
        migrate(url)
        store_dir = self.tmp / f"objects-{self.n}"
        store_dir.mkdir()
        return url, store_dir.as_uri()

    def start_worker(self, db_url: str, storage_url: str, slots: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "DARKROOM_DATABASE_URL": db_url,
               "DARKROOM_STORAGE_URL": storage_url, "DARKROOM_LEASE_SECONDS": "30",
               "DARKROOM_POLL_SECONDS": "5"}
        log = (self.tmp / f"worker-{self.n}-{slots}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "darkroom.cli", "worker",
                                 "--concurrency", str(slots), "--name", f"bench{slots}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        # Idle means: started, decoders warm, LISTEN in place. Its log says so.
        deadline = time.monotonic() + 60
        path = Path(log.name)
        while b"worker started" not in path.read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(path.read_text())
            time.sleep(0.05)
        time.sleep(1.0)  # let the decoder children finish importing libvips
        return proc


async def stage(db_url: str, storage_url: str, images: list[bytes]) -> list[tuple[Any, str]]:
    """Cards with their originals stored, still pending: confirmed later, all at once."""
    store = open_store(storage_url)
    pool = await open_pool(db_url, min_size=1, max_size=2)
    q = Queue(Database(pool), lease_seconds=30, max_attempts=3, retry_base_seconds=1,
              retry_cap_seconds=1)
    staged = []
    for data in images:
        card = await q.create_file(owner="bench", filename="x", content_type="image/jpeg",
                                   size=len(data))
        staged.append((card.id, store.put(card.original_key, data)))
    await pool.close()
    return staged


async def confirm_all(db_url: str, staged: list[tuple[Any, str]]) -> None:
    pool = await open_pool(db_url, min_size=1, max_size=2)
    q = Queue(Database(pool), lease_seconds=30, max_attempts=3, retry_base_seconds=1,
              retry_cap_seconds=1)
    for file_id, version in staged:
        assert (await q.confirm_card(file_id, "bench", version)).outcome is ConfirmOutcome.QUEUED
    await pool.close()


def wait_ready(db_url: str, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while True:
            row = conn.execute(TEST_SQL["finished_count"]).fetchone()
            if row and row[0] >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("cards not finished")
            time.sleep(0.01)


def end_to_end(system: System, images: list[bytes], slots: int) -> float:
    db_url, storage_url = system.fresh()
    staged = asyncio.run(stage(db_url, storage_url, images))
    worker = system.start_worker(db_url, storage_url, slots)
    try:
        start = time.perf_counter()
        asyncio.run(confirm_all(db_url, staged))
        wait_ready(db_url, len(images))
        elapsed = time.perf_counter() - start
    finally:
        worker.terminate()
        worker.wait(60)
    with psycopg.connect(db_url) as conn:
        row = conn.execute(SQL["ready_count"]).fetchone()
    assert row is not None and row[0] == len(images), "not every card became ready"
    return len(images) / elapsed


def latency(system: System, samples: int) -> list[float]:
    """Milliseconds from the confirm's commit to the claim, both on the database clock."""
    db_url, storage_url = system.fresh()
    tiny = corpus(1)[0]
    staged = asyncio.run(stage(db_url, storage_url, [tiny] * samples))
    worker = system.start_worker(db_url, storage_url, 1)
    try:
        for i, item in enumerate(staged):
            asyncio.run(confirm_all(db_url, [item]))
            wait_ready(db_url, i + 1)
            time.sleep(0.1)  # idle again before the next one
    finally:
        worker.terminate()
        worker.wait(60)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(SQL["confirm_to_claim_ms"]).fetchall()
    return sorted(float(r[0]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=36)
    parser.add_argument("--latency-samples", type=int, default=40)
    args = parser.parse_args()
    images = corpus(args.images)
    result = WorkerResult(
        machine=machine(),
        command=command("worker"))
    with tempfile.TemporaryDirectory(prefix="darkroom-bench-") as tmp:
        system = System(Path(tmp))
        for slots in (1, 2):
            alone = pipeline_alone(images, slots)
            e2e = end_to_end(system, images, slots)
            result.slots.append(WorkerSlots(slots, alone, e2e, e2e / alone))
        lat = latency(system, args.latency_samples)
        result.latency_ms = WorkerLatency(samples=len(lat), p50=statistics.median(lat),
                                          p95=percentile(lat, 0.95), max=lat[-1])
    result.machine["loadavg_end"] = list(os.getloadavg())
    publish("worker", result)

if __name__ == "__main__":
    main()
