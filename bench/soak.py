"""An hour-style soak compressed to minutes: steady uploads while workers run flat out.

    .venv/bin/python -m bench.soak [--images 100000] [--rate 150] [--sample 10]

Real processes: a private PostgreSQL (pgserver), the local object store, `darkroom api`,
one `darkroom worker` and the sweeper (events kept for 60 s here, so pruning is part of
the run). A load generator uploads tiny images through the HTTP API at a steady rate
(create, PUT the bytes, confirm) until `--images` have been processed. Every `--sample`
seconds it records the confirm latency of the window, the queue depth, the time of one
claim (run and rolled back), the size of each table and index, the dead tuples and the
autovacuum runs. The verdict: dead rows and index sizes stay bounded, the event log is
pruned, and the claim time does not drift up between the first and the last windows.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from bench.results import SoakResult, SoakVerdict
from bench.runs import command
from bench.sections import publish
from bench.sql import SQL
from bench.stats import percentile
from darkroom.db import embedded
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES
from darkroom.queue import claim_params
from tests.support.services import free_port
from tests.support.sql import SQL as TEST_SQL

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "soak.json"


def tiny_images(n: int = 64) -> list[bytes]:
    """Small distinct PNGs: the soak is about the queue, not the decoder."""
    from PIL import Image

    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", (24, 16), (i * 4 % 256, 80, 255 - i)).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


class Soak:
    def __init__(self, tmp: Path, rate: float) -> None:
        base = Path(tempfile.mkdtemp(prefix="darkroom-soak-pg-"))
        self.db_url = embedded.url(base / "pg", stop_on_exit=True)
        migrate(self.db_url)
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        self.rate = rate
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
            "DARKROOM_DATABASE_URL": self.db_url,
            "DARKROOM_STORAGE_URL": (tmp / "objects").as_uri(),
            "DARKROOM_DATA_DIR": str(tmp / "data"),
            "DARKROOM_EVENT_RETENTION_DAYS": str(60 / 86_400),
            "DARKROOM_SWEEP_INTERVAL_SECONDS": "5",
        }
        self.logs = tmp
        self.procs = [
            self._start("api", "--port", str(port)),
            self._start("worker", "--concurrency", "2", "--name", "soak"),
            self._start("sweep"),
        ]
        key = subprocess.run([sys.executable, "-m", "darkroom.cli", "keys", "create",
                              "--owner", "soak"], env=self.env, capture_output=True,
                             text=True, check=True)
        self.key = key.stdout.strip()
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.api}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the API did not start")
            time.sleep(0.2)

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{args[0]}.log").open("wb")
        return subprocess.Popen([sys.executable, "-m", "darkroom.cli", *args], env=self.env,
                                stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(60)


def sample(db: psycopg.Connection[Any]) -> dict[str, Any]:
    """One snapshot of the database: depth, claim time, sizes, dead rows, vacuums."""
    counts = {r["status"]: r["n"] for r in db.execute(TEST_SQL["status_counts"]).fetchall()}
    claims = []
    for _ in range(5):
        with db.transaction(force_rollback=True):
            start = time.perf_counter()
            db.execute(QUERIES["claim"], claim_params(
                n=1, max_attempts=3, lease_seconds=60.0, worker="probe", claim=uuid.uuid4(),
                bulk_share=0.1)).fetchall()
            claims.append((time.perf_counter() - start) * 1000)
    sizes = {r["name"]: r["bytes"] for r in db.execute(SQL["relation_sizes"]).fetchall()}
    dead = {r["relname"]: {"live": r["n_live_tup"], "dead": r["n_dead_tup"],
                           "autovacuums": r["autovacuum_count"]}
            for r in db.execute(SQL["table_activity"]).fetchall()}
    return {"counts": counts, "claim_ms": statistics.median(claims), "sizes": sizes,
            "tables": dead}


async def generate(soak: Soak, target: int, images: list[bytes], latencies: list[float],
                   stop: asyncio.Event) -> int:
    """Open loop at `rate` uploads/s, each create -> PUT -> confirm, until `target` sent."""
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    headers = {"Authorization": f"Bearer {soak.key}"}
    sent = 0
    async with httpx.AsyncClient(base_url=soak.api, headers=headers, limits=limits,
                                 timeout=30) as client:
        tasks: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            data = images[i % len(images)]
            card = (await client.post("/v1/files", json={
                "filename": f"t{i}.png", "content_type": "image/png", "size": len(data)}
                )).json()
            put = await client.put(card["upload"]["url"], content=data,
                                   headers=card["upload"]["headers"])
            start = time.perf_counter()
            r = await client.post(f"/v1/files/{card['id']}/confirm",
                                  json={"version": put.json()["version"]})
            latencies.append((time.perf_counter() - start) * 1000)
            assert r.status_code == 202, r.text

        begin = time.perf_counter()
        while sent < target and not stop.is_set():
            due = begin + sent / soak.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= 64:  # the API is saturated: slow down rather than pile up
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(one(sent))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.gather(*tasks)
    return sent


async def soak_run(soak: Soak, target: int, every: float) -> SoakResult:
    images = tiny_images()
    latencies: list[float] = []
    windows: list[dict[str, Any]] = []
    stop = asyncio.Event()
    db = await asyncio.to_thread(psycopg.connect, soak.db_url, autocommit=True,
                                 row_factory=dict_row)
    gen = asyncio.create_task(generate(soak, target, images, latencies, stop))
    started = time.perf_counter()
    taken = 0
    while True:
        await asyncio.sleep(every)
        snap = await asyncio.to_thread(sample, db)
        window, taken = latencies[taken:], len(latencies)
        snap["t"] = round(time.perf_counter() - started, 1)
        snap["confirm_ms"] = ({"p50": statistics.median(window),
                               "p99": percentile(sorted(window), 0.99),
                               "n": len(window)} if window else None)
        done = snap["counts"].get("ready", 0) + snap["counts"].get("rejected", 0)
        snap["processed"] = done
        windows.append(snap)
        print(f"t={snap['t']:>6}s processed={done:>7} queued={snap['counts'].get('queued', 0):>5}"
              f" claim={snap['claim_ms']:.2f}ms confirm_p99="
              f"{snap['confirm_ms']['p99'] if snap['confirm_ms'] else float('nan'):.1f}ms"
              f" events={snap['tables'].get('archive_events', {}).get('live')}", flush=True)
        if done >= target:
            break
        if gen.done() and gen.exception():
            raise gen.exception()  # type: ignore[misc]
    stop.set()
    await gen
    db.close()
    return SoakResult(target=target, rate=soak.rate, seconds=time.perf_counter() - started,
                      windows=windows)


def verdict(result: SoakResult) -> SoakVerdict:
    windows = result.windows
    k = max(1, len(windows) // 5)
    first = statistics.median(w["claim_ms"] for w in windows[:k])
    last = statistics.median(w["claim_ms"] for w in windows[-k:])

    def size(w: dict[str, Any], name: str) -> int:
        return int(w["sizes"].get(name, 0))

    queue_indexes = ("archive_files_due", "archive_files_leased")
    return SoakVerdict(
        processed=windows[-1]["processed"],
        throughput_per_s=windows[-1]["processed"] / result.seconds,
        claim_ms_first=first, claim_ms_last=last, claim_drift=last / first,
        queue_index_bytes_max=max(sum(size(w, n) for n in queue_indexes) for w in windows),
        queue_index_bytes_last=sum(size(windows[-1], n) for n in queue_indexes),
        files_table_bytes_last=size(windows[-1], "archive_files"),
        events_live_max=max(w["tables"].get("archive_events", {}).get("live", 0)
                            for w in windows),
        files_dead_max=max(w["tables"]["archive_files"]["dead"] for w in windows),
        autovacuums_files=windows[-1]["tables"]["archive_files"]["autovacuums"],
        confirm_p99_ms_max=max((w["confirm_ms"]["p99"] for w in windows if w["confirm_ms"]),
                               default=None),
        queued_max=max(w["counts"].get("queued", 0) for w in windows),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--sample", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="darkroom-soak-") as tmp:
        soak = Soak(Path(tmp), args.rate)
        try:
            result = asyncio.run(soak_run(soak, args.images, args.sample))
        finally:
            soak.stop()
    result.verdict = verdict(result)
    result.command = command("soak")
    publish("soak", result, OUT)


if __name__ == "__main__":
    main()
