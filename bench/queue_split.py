"""Where a no-op job's CPU goes: PostgreSQL backends versus the workers' Python.

    .venv/bin/python -m bench.queue_split [--workers 4] [--jobs 20000] [--repeats 5]
        [--variant NAME "SQL; SQL" ...]

The same drain as bench/queue.py's darkroom throughput run (claim(100) → complete_many),
but every worker also reads its own backend's CPU time from /proc before and after, so
the split is exact rather than inferred from machine totals. With --variant, each NAME
gets its own database, migrated and then altered by its SQL (drop an index, say), and
the drains alternate between the plain schema and the variants, so a burst of load from
a neighbour hits them alike: compare the medians of one run, never across runs.

Writes bench/out/queue_split.json (bench/results.py `QueueSplitResult`) and prints it
through its renderer (bench/sections.py `queue_split_section`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import machine, process_cpu_seconds
from bench.queue import (
    DARKROOM_BATCH,
    Server,
    _queue,
    darkroom_seed_jobs,
    drain_batched,
    log,
    run_processes,
)
from bench.results import QueueSplitResult, QueueSplitRun, save
from bench.runs import OUT, command
from bench.sections import queue_split_section
from bench.sql import SQL
from darkroom.db import embedded
from darkroom.db.connection import open_pool
from darkroom.db.migrations import migrate


async def _drain(barrier: Any, url: str, name: str) -> tuple[int, float, float, float]:
    pool = await open_pool(url, min_size=1, max_size=1, name=name)
    queue = _queue(pool, name)
    async with pool.connection() as conn:
        cur = await conn.execute(SQL["backend_pid"])
        row: Any = await cur.fetchone()  # the pool's rows are dicts
        backend = int(row["pid"])
    try:
        barrier.wait()
        pg0, py0 = process_cpu_seconds(backend), time.process_time()
        done = await drain_batched(queue, DARKROOM_BATCH)
        return (done, time.time(), process_cpu_seconds(backend) - pg0,
                time.process_time() - py0)
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
    parser.add_argument("--out", type=Path, default=OUT / "queue_split.json")
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
        result = QueueSplitResult(
            machine=machine(), command=command("queue_split"),
            workers=args.workers, jobs=args.jobs, repeats=args.repeats,
            variants=dict(variants), runs={n: [] for n, _ in variants})
        for rep in range(args.repeats):
            for name, _ in variants:
                darkroom_seed_jobs(urls[name], args.jobs)
                t0, out, cpu = run_processes(
                    drain, [(urls[name], f"w{i}") for i in range(args.workers)])
                n = args.jobs
                run = QueueSplitRun(jobs_per_s=n / (max(r[1] for r in out) - t0),
                                    machine_us_per_job=cpu.busy_s / n * 1e6,
                                    backends_us_per_job=sum(r[2] for r in out) / n * 1e6,
                                    python_us_per_job=sum(r[3] for r in out) / n * 1e6)
                result.runs[name].append(run)
                log(f"  [{rep + 1}/{args.repeats}] {name:20} {run.jobs_per_s:8,.0f} jobs/s, "
                    f"machine {run.machine_us_per_job:5.1f} µs/job = backends "
                    f"{run.backends_us_per_job:5.1f} + workers' Python "
                    f"{run.python_us_per_job:5.1f} + rest")
    save(result, args.out)
    print("\n".join(queue_split_section(result)))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
