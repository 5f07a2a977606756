"""Where a no-op job's CPU goes: PostgreSQL backends versus the workers' Python.

    .venv/bin/python -m bench.queue_split [--workers 4] [--jobs 20000] [--repeats 5]
        [--variant NAME "SQL; SQL" ...]

The same drain as bench/queue.py's darkroom throughput run (claim(100) → complete_many),
but every worker also reads its own backend's CPU time from /proc before and after, so
the split is exact rather than inferred from machine totals. With --variant, each NAME
gets its own database, migrated and then altered by its SQL (drop an index, say), and
the drains alternate between the plain schema and the variants, so a burst of load from
a neighbour hits them alike: compare the medians of one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import TICK, process_ticks
from bench.queue import (
    DARKROOM_BATCH,
    Server,
    _queue,
    darkroom_seed_jobs,
    drain_batches,
    run_processes,
)
from darkroom.db import embedded
from darkroom.db.connection import open_pool
from darkroom.db.migrations import migrate


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (the backend's, here)."""
    return process_ticks(pid) / TICK


async def _drain(barrier: Any, url: str, name: str) -> tuple[int, float, float, float]:
    pool = await open_pool(url, min_size=1, max_size=1, name=name)
    queue = _queue(pool, name)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT pg_backend_pid() AS pid")
        backend = int((await cur.fetchone())["pid"])  # type: ignore[index]
    try:
        barrier.wait()
        pg0, py0 = process_cpu(backend), time.process_time()
        done = await drain_batches(queue, DARKROOM_BATCH)
        return done, time.time(), process_cpu(backend) - pg0, time.process_time() - py0
    finally:
        await pool.close()


def drain(barrier: Any, url: str, name: str) -> tuple[int, float, float, float]:
    return asyncio.run(_drain(barrier, url, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", nargs=2, action="append", default=[],
                        metavar=("NAME", "SQL"), help="a schema variant to compare")
    parser.add_argument("--database-url", help="a superuser URL (default: embedded)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dr-split-") as tmp:
        server = Server(args.database_url
                        or embedded.url(Path(tmp) / "pg", stop_on_exit=True))
        variants = [("as built", ""), *((name, sql) for name, sql in args.variant)]
        urls = {}
        for i, (name, sql) in enumerate(variants):
            urls[name] = server.fresh_db(f"bench_split_{i}")
            migrate(urls[name])
            if sql:
                with psycopg.connect(urls[name], autocommit=True) as conn:
                    conn.execute(sql.encode())
        runs: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n, _ in variants}
        for rep in range(args.repeats):
            for name, _ in variants:
                darkroom_seed_jobs(urls[name], args.jobs)
                t0, out, cpu = run_processes(
                    drain, [(urls[name], f"w{i}") for i in range(args.workers)])
                n = args.jobs
                row = (n / (max(r[1] for r in out) - t0), cpu.busy_s / n * 1e6,
                       sum(r[2] for r in out) / n * 1e6, sum(r[3] for r in out) / n * 1e6)
                runs[name].append(row)
                print(f"  [{rep + 1}/{args.repeats}] {name:20} {row[0]:8,.0f} jobs/s, "
                      f"machine {row[1]:5.1f} µs/job = backends {row[2]:5.1f} + "
                      f"workers' Python {row[3]:5.1f} + rest", flush=True)
        print(f"\nmedians of {args.repeats} runs, {args.workers} workers, {args.jobs:,} jobs:")
        print("| schema | jobs/s | machine µs/job | backends µs/job | workers' Python µs/job |")
        print("|---|---:|---:|---:|---:|")
        for name, rows in runs.items():
            cols = [statistics.median(c) for c in zip(*rows, strict=True)]
            print(f"| {name} | {cols[0]:,.0f} | {cols[1]:.1f} | {cols[2]:.1f} | {cols[3]:.1f} |")


if __name__ == "__main__":
    main()
