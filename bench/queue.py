"""Queue benchmark: darkroom's lease protocol against Procrastinate, PgQueuer and the seed.

One run, one PostgreSQL server, a fresh database per system. Measures
  1. no-op throughput (claim -> fenced complete) at 1, 4 and 16 worker processes; darkroom
     on the worker's own path (the worker's `Completer`, slots refilled as they free up),
     and once with batched completions (`complete_many`) as the reference,
  2. idle enqueue -> start latency at a steady 50 jobs/s, darkroom, PgQueuer,
     Procrastinate and the seed in turn, in the same run,
  3. claim time with 1,000,000 finished rows + 20,000 queued versus ~10 rows,
writes bench/out/queue.json (bench/results.py `QueueResult`) and prints it through its
renderer (bench/sections.py `queue_section`).

    .venv/bin/python bench/queue.py [--quick] [--database-url URL]

Each system lives in its own small adapter (`*_seed_jobs`, `*_drain`, `*_done`, gathered
in `adapters()`), so one can be rerun alone: `--only pgqueuer`, or from Python
`run_throughput(Server(url), adapters()[2], workers=4, jobs=20_000)` (jobs/s and the CPU
the machine spent meanwhile).
"""

# The file is called queue.py, so when run as a script its folder is sys.path[0] and it
# would shadow the standard library's `queue`, which multiprocessing imports. Drop that
# entry before anything imports `queue`; spawned workers inherit the cleaned sys.path.
import sys
from pathlib import Path

if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

from bench.cpu import TICK, machine, machine_ticks
from bench.results import QueueClaim, QueueLatency, QueueResult, QueueThroughput, load
from bench.runs import command
from bench.sections import BATCHED, publish
from bench.sql import SQL, composed
from bench.stats import latency_summary
from darkroom.completer import Completer
from darkroom.completer import running as completer_running
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES
from darkroom.layout import DERIVED, ORIGINALS, original_key
from darkroom.queue import NOTIFY_CHANNEL, Derived, Lease, Queue, claim_params, derived_key
from darkroom.worker import claim_room

OUT = Path(__file__).resolve().parent / "out" / "queue.json"
WORKER_COUNTS = (1, 4, 16)
# Job slots per worker process (`darkroom worker --concurrency`). The worker's completer
# commits the jobs that finish together in one statement, so more slots mean larger
# batches; 4 and 32 bracket a small and a large worker, and 128 and 512 are the worker's
# path beside PgQueuer's batch sizes 100 and 1000 (jobs fetched and run at once).
DARKROOM_SLOTS = (4, 32, 128, 512)
WORKER_POOL = 4
# The reference: one claim(100) and one complete_many per 100 jobs, the most batching any
# path can do; the same-run ratio to it says what the worker's path leaves on the table.
DARKROOM_BATCH = 100
# PgQueuer's batch_size is its main throughput knob (default 10); the best one is
# whichever wins in this run, so several are tried. Its no-op throughput grows with the
# batch up to about 1,000 (1 worker: 14,600 jobs/s at 100, 18,400 at 200, 19,200 at 400,
# 19,600 at 1,000 on a 2-core Xeon), so the largest is the one run three times.
PGQUEUER_BATCHES = (10, 100, 1000)
# Procrastinate fetches one job per query whatever the concurrency; a little in-process
# concurrency overlaps the finish of one job with the fetch of the next.
PROCRASTINATE_CONCURRENCY = 4
TINY = 40  # queued rows in the "~10 rows" table of the claim-time comparison


@dataclass(frozen=True)
class Plan:
    """How big each measurement is; --quick shrinks all of them."""

    jobs: int  # darkroom and PgQueuer throughput runs
    slow_jobs: int  # Procrastinate and the seed drain ~10x slower: fewer jobs, same rate
    repeats: int
    finished_rows: int
    queued_rows: int
    claims: int
    latency_seconds: float
    backlog_rows: int  # queued rows only: how the claim copes with a large backlog
    workers: tuple[int, ...] = WORKER_COUNTS
    latency_rate: float = 50.0
    latency_rounds: int = 3  # latency_seconds split into rounds that take the systems in turn
    quick: bool = False

    @property
    def latency_jobs(self) -> int:
        """Jobs each system is sent in its idle-latency run."""
        return int(self.latency_rate * self.latency_seconds)


FULL = Plan(jobs=20_000, slow_jobs=4_000, repeats=5, finished_rows=1_000_000,
            queued_rows=20_000, claims=300, latency_seconds=10.0, backlog_rows=200_000)
# A short check of the throughput target after a protocol change (`--short --only
# darkroom,pgqueuer --skip latency,claim`): fewer jobs and worker counts, same repeats.
SHORT = Plan(jobs=10_000, slow_jobs=1_000, repeats=3, finished_rows=1_000_000,
             queued_rows=20_000, claims=300, latency_seconds=10.0, backlog_rows=200_000,
             workers=(1, 4))
# Spawning 16 workers costs seconds on 2 cores; the smoke test stops at 4.
QUICK = Plan(jobs=2_000, slow_jobs=300, repeats=1, finished_rows=100_000,
             queued_rows=2_000, claims=40, latency_seconds=2.0, backlog_rows=20_000,
             workers=(1, 4), latency_rounds=1, quick=True)


# --- the server and its databases ---------------------------------------------------------


@dataclass
class Server:
    """One PostgreSQL server; every system gets its own fresh database on it."""

    url: str

    def db_url(self, name: str) -> str:
        # A URL (not key=value) because asyncpg, which PgQueuer prefers, takes only URLs.
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path="/" + name))

    def fresh_db(self, name: str) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(composed("drop_database_forced", name=name))
            conn.execute(composed("create_database", name=name))
        return self.db_url(name)

    def describe(self) -> dict[str, str]:
        settings = {}
        with psycopg.connect(self.url, autocommit=True) as conn:
            for name in ("server_version", "shared_buffers", "synchronous_commit", "fsync",
                         "max_connections"):
                row = conn.execute(SQL["server_setting"], {"name": name}).fetchone()
                assert row is not None
                settings[name] = str(row[0])
        return settings


# --- running N worker processes -----------------------------------------------------------


def _worker_entry(target: Callable[..., Any], barrier: Any, results: Any,
                  args: tuple[Any, ...]) -> None:
    logging.disable(logging.WARNING)  # peers log every job at INFO; keep stdout a table
    try:
        results.put(target(barrier, *args))
    except BaseException as exc:
        results.put(exc)
        raise


@dataclass(frozen=True)
class CpuWindow:
    """Machine-wide CPU between two instants (bench/cpu.py; zero where /proc is missing)."""

    busy_s: float  # every process here, PostgreSQL included
    steal_s: float  # time the hypervisor gave this machine's CPUs to someone else

    @staticmethod
    def sample() -> "CpuWindow":
        busy, steal, _ = machine_ticks()
        return CpuWindow(busy / TICK, steal / TICK)

    def __sub__(self, other: "CpuWindow") -> "CpuWindow":
        return CpuWindow(self.busy_s - other.busy_s, self.steal_s - other.steal_s)


def run_processes(target: Callable[..., Any], args: list[tuple[Any, ...]],
                  timeout: float = 600.0) -> tuple[float, list[Any], CpuWindow]:
    """Start one spawned process per args, release them together.

    Answers (t0, results, CPU used while they ran). Each target calls `barrier.wait()`
    once its connections are open, so process start-up and imports are not timed; t0 is
    taken the moment the barrier opens.
    """
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(args) + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker_entry, args=(target, barrier, results, a))
             for a in args]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=180)
        t0, cpu0 = time.time(), CpuWindow.sample()
        out = [results.get(timeout=timeout) for _ in procs]
        cpu = CpuWindow.sample() - cpu0
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for r in out:
        if isinstance(r, BaseException):
            raise RuntimeError(f"worker failed: {r!r}") from r
    return t0, out, cpu


# --- darkroom ------------------------------------------------------------------------------


def noop_result(lease: Lease) -> Derived:
    return Derived(derived_key(lease), "v", "0" * 64, 1, 1, 1)


def _queue(pool: Any, name: str) -> Queue:
    return Queue(Database(pool), lease_seconds=300, max_attempts=3, retry_base_seconds=1,
                 retry_cap_seconds=1, worker=name)


def darkroom_seed_jobs(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["empty_queue"])
        conn.execute(SQL["fill_queued"], {"originals": ORIGINALS, "n": n})
        conn.execute(SQL["vacuum_analyze_cards"])


class _Refill:
    """The worker's refill (darkroom/worker.py `_Refill`) without its breaker and stop: a
    batch's commit claims what `claim_room` leaves. A no-op job hands its result over as it
    starts, which frees its slot: every slot is idle, and the worker's jobs are the ones
    whose commit is on its way."""

    def __init__(self, slots: int, committing: set[asyncio.Future[bool]]) -> None:
        self.slots, self.committing = slots, committing
        self.ahead: list[Lease] = []
        self.claiming = 0

    def room(self) -> int:
        return claim_room(slots=self.slots, idle=self.slots, jobs=len(self.committing),
                          kept=len(self.ahead), claiming=self.claiming)

    def wanted(self, finishing: int) -> int:
        n = self.room()
        self.claiming += n
        return n

    def claimed(self, leases: list[Lease], asked: int, sent: float) -> None:
        self.claiming -= asked
        self.ahead += leases

    def unknown(self, claim_id: uuid.UUID, asked: int, sent: float) -> None:
        raise RuntimeError("a claim's answer was lost in a no-op run")


async def drain_like_worker(queue: Queue, slots: int) -> int:
    """The worker's own loop with no-op jobs: claim for the free slots and one lease kept
    ahead per slot (`worker.claim_room`); each job hands its result to the worker's
    `Completer`, which frees its slot, and the completer commits the results handed over
    together in one statement, sent with the claim of the room they leave (as
    `Worker._attempt` does); start what a commit claimed, claim again for the room still
    left; until the queue is empty. Answers the jobs done."""
    async def direct(call: Callable[[], Awaitable[set[uuid.UUID]]],
                     _leases: Sequence[Lease]) -> set[uuid.UUID]:
        return await call()

    committing: set[asyncio.Future[bool]] = set()
    refill = _Refill(slots, committing)
    completer = Completer(queue, direct, refill=refill)

    def start(lease: Lease) -> None:
        committing.add(completer.submit(lease, noop_result(lease)))

    done = 0
    async with completer_running(completer):
        while True:
            while refill.ahead:
                start(refill.ahead.pop(0))
            free = refill.room()
            for lease in await queue.claim(free) if free > 0 else []:
                start(lease)
            if not committing:
                return done
            finished, _ = await asyncio.wait(committing, return_when=asyncio.FIRST_COMPLETED)
            committing.difference_update(finished)  # the same set the refill counts
            for answer in finished:
                if not answer.result():
                    raise RuntimeError("a lease was lost in a no-op run")
            done += len(finished)


async def drain_batched(queue: Queue, batch: int) -> int:
    """claim(batch) -> complete_many: every row still fenced by its token, but one
    statement for the batch. Not the worker's path: the reference for what batching the
    worker's completions would buy."""
    done = 0
    while leases := await queue.claim(batch):
        lost = await queue.complete_many([(lease, noop_result(lease)) for lease in leases])
        if lost:
            raise RuntimeError(f"{len(lost)} leases lost in a no-op run")
        done += len(leases)
    return done


async def _darkroom_drain(barrier: Any, url: str, slots: int, name: str,
                          batched: bool) -> tuple[int, float]:
    # The worker's pool size (darkroom/worker.py run_worker: max_size=4).
    pool = await open_pool(url, min_size=1, max_size=WORKER_POOL, name=name, generic_plans=True)
    queue = _queue(pool, name)
    try:
        barrier.wait()
        done = await (drain_batched(queue, slots) if batched
                      else drain_like_worker(queue, slots))
        return done, time.time()
    finally:
        await pool.close()


def darkroom_drain(barrier: Any, url: str, slots: int, name: str,
                   batched: bool = False) -> tuple[int, float]:
    """One darkroom worker process with `slots` job slots, until the queue is empty."""
    return asyncio.run(_darkroom_drain(barrier, url, slots, name, batched))


def count(url: str, sql: str) -> int:
    """One `SELECT count(*)` of a finished drain."""
    with psycopg.connect(url) as conn:
        return int(conn.execute(sql.encode()).fetchone()[0])  # type: ignore[index]


def archive_done(url: str) -> int:
    """Jobs finished in darkroom's table or the seed's: both mark them `ready`."""
    return count(url, SQL["ready_count"])


# --- the seed's own protocol -----------------------------------------------------------------

# The seed's table (its archive_files, reduced) and its worker's statements, verbatim from
# its worker.mjs, are bench/queries.sql's `seed_*`.


def seed_prepare(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["seed_schema"])
        conn.execute(SQL["seed_empty"])


def seed_seed_jobs(url: str, n: int) -> None:
    seed_prepare(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["seed_fill_queued"], {"originals": ORIGINALS, "n": n})
        conn.execute(SQL["vacuum_analyze_cards"])


def seed_claim(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The seed's claim(): one row, select and lease in one transaction."""
    with conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        row = cur.execute(SQL["seed_select_due"]).fetchone()
        if row is None:
            return None
        return cur.execute(SQL["seed_lease"], {"id": row["id"], "token": uuid.uuid4()}).fetchone()


def seed_complete(conn: psycopg.Connection[Any], row: Any) -> None:
    with conn.transaction():
        conn.execute(SQL["seed_complete"], {"id": row["id"], "token": row["lease_token"],
                                     "key": f"{DERIVED}{row['id']}", "version": "v",
                                     "sha": "0" * 64})


def seed_drain(barrier: Any, url: str) -> tuple[int, float]:
    """One seed worker (worker.mjs): claim one, complete it; stop at the first empty claim.

    The seed sleeps 1 s when the queue is empty; a drain has nothing left to wait for then.
    """
    done = 0
    with psycopg.connect(url, row_factory=dict_row) as conn:
        barrier.wait()
        while (row := seed_claim(conn)) is not None:
            seed_complete(conn, row)
            done += 1
        return done, time.time()


# --- PgQueuer --------------------------------------------------------------------------------


def _asyncpg_available() -> bool:
    return importlib.util.find_spec("asyncpg") is not None


def _asyncpg_dsn(url: str) -> str:
    """The URL without libpq's `require_auth` (the embedded server's URLs carry it):
    asyncpg sends a query key it does not know to the server as a setting, which the
    server refuses. The embedded server asks for SCRAM alone, which asyncpg speaks."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "require_auth"]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def _pgqueuer_queries(url: str) -> tuple[Any, Any]:
    from pgqueuer.queries import Queries

    # asyncpg is PgQueuer's default and fastest driver (its own benchmark uses it);
    # psycopg is the fallback when the asyncpg extra is not installed.
    if _asyncpg_available():
        import asyncpg  # type: ignore[import-untyped]
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(dsn=_asyncpg_dsn(url))
        return Queries(AsyncpgDriver(conn)), conn
    from pgqueuer.db import PsycopgDriver

    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return Queries(PsycopgDriver(aconn)), aconn


def pgqueuer_seed_jobs(url: str, n: int) -> None:
    async def go() -> None:
        queries, conn = await _pgqueuer_queries(url)
        try:
            if not await queries.schema_is_installed():
                await queries.install()
            await queries.clear_queue()
            await queries.clear_statistics_log()
            await queries.clear_queue_log()  # done is counted from the log: start it empty
            for start in range(0, n, 5_000):
                k = min(5_000, n - start)
                await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
        finally:
            await conn.close()
    asyncio.run(go())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["pgqueuer_vacuum"])


async def _pgqueuer_drain(barrier: Any, url: str, batch: int) -> tuple[int, float]:
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.types import QueueExecutionMode

    queries, conn = await _pgqueuer_queries(url)
    qm = QueueManager(queries)
    done = 0

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        nonlocal done
        done += 1

    try:
        barrier.wait()
        # drain: return once the queue is empty and every picked job is logged done.
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
        return done, time.time()
    finally:
        await conn.close()


def pgqueuer_drain(barrier: Any, url: str, batch: int) -> tuple[int, float]:
    """One PgQueuer QueueManager in drain mode with `batch_size=batch`."""
    return asyncio.run(_pgqueuer_drain(barrier, url, batch))


def pgqueuer_done(url: str) -> int:
    # Finished jobs leave the pgqueuer table and are logged as successful.
    left = count(url, SQL["pgqueuer_left"])
    ok = count(url, SQL["pgqueuer_successful"])
    return ok if left == 0 else -left


# --- Procrastinate ---------------------------------------------------------------------------


def _procrastinate_app(url: str, pool_size: int) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=url, min_size=1, max_size=pool_size))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


def procrastinate_seed_jobs(url: str, n: int) -> None:
    async def go() -> None:
        app = _procrastinate_app(url, 2)
        async with app.open_async():
            with psycopg.connect(url, autocommit=True) as conn:
                installed = conn.execute(
                    SQL["procrastinate_installed"]).fetchone()[0]  # type: ignore[index]
                if installed:
                    conn.execute(SQL["procrastinate_empty"])
            if not installed:
                await app.schema_manager.apply_schema_async()
            task = app.tasks["noop"]
            for start in range(0, n, 2_000):
                await task.batch_defer_async(*[{} for _ in range(min(2_000, n - start))])
    asyncio.run(go())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["procrastinate_vacuum"])


async def _procrastinate_drain(barrier: Any, url: str, concurrency: int) -> tuple[int, float]:
    app = _procrastinate_app(url, concurrency + 2)
    async with app.open_async():
        barrier.wait()
        # wait=False: stop once no job is left. No LISTEN: nothing arrives during a drain.
        await app.run_worker_async(concurrency=concurrency, wait=False, listen_notify=False,
                                   install_signal_handlers=False)
        return -1, time.time()


def procrastinate_drain(barrier: Any, url: str, concurrency: int) -> tuple[int, float]:
    """One Procrastinate worker process with `concurrency` in-process job slots."""
    return asyncio.run(_procrastinate_drain(barrier, url, concurrency))


def procrastinate_done(url: str) -> int:
    return count(url, SQL["procrastinate_succeeded"])


# --- throughput --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """What the throughput runner needs to know of one system in one configuration."""

    system: str
    config: str
    db: str
    seed_jobs: Callable[[str, int], None]
    drain: Callable[..., tuple[int, float]]
    drain_args: Callable[[str, int], tuple[Any, ...]]  # (url, worker index) -> args
    done: Callable[[str], int]
    slow: bool = False  # ~10x slower per job: drains plan.slow_jobs instead of plan.jobs
    once: bool = False  # run once, not plan.repeats times (reference points, not targets)


def adapters(quick: bool = False) -> list[Adapter]:
    out = [Adapter("darkroom", f"{k} slots, the worker's Completer (the worker's path)",
                   "bench_darkroom", darkroom_seed_jobs, darkroom_drain,
                   lambda url, i, k=k: (url, k, f"w{i}"),  # type: ignore[misc]
                   archive_done)
           for k in DARKROOM_SLOTS]
    out.append(Adapter(BATCHED, f"claim {DARKROOM_BATCH}, complete_many",
                       "bench_darkroom", darkroom_seed_jobs, darkroom_drain,
                       lambda url, i: (url, DARKROOM_BATCH, f"w{i}", True), archive_done,
                       once=True))
    driver = "asyncpg" if _asyncpg_available() else "psycopg"
    out += [Adapter("pgqueuer", f"batch_size {b}, {driver}", "bench_pgqueuer",
                    pgqueuer_seed_jobs, pgqueuer_drain,
                    lambda url, i, b=b: (url, b), pgqueuer_done,  # type: ignore[misc]
                    once=b != max(PGQUEUER_BATCHES))
            for b in (PGQUEUER_BATCHES[-1:] if quick else PGQUEUER_BATCHES)]
    out += [Adapter("procrastinate", f"concurrency {PROCRASTINATE_CONCURRENCY}",
                    "bench_procrastinate", procrastinate_seed_jobs, procrastinate_drain,
                    lambda url, i: (url, PROCRASTINATE_CONCURRENCY), procrastinate_done,
                    slow=True, once=True),
            Adapter("seed", "LIMIT 1 per transaction, OR query", "bench_seed",
                    seed_seed_jobs, seed_drain, lambda url, i: (url,), archive_done, slow=True,
                    once=True)]
    return out


def run_throughput(server: Server, adapter: Adapter, workers: int,
                   jobs: int) -> tuple[float, CpuWindow]:
    """One drain of `jobs` no-op jobs by `workers` processes; answers jobs/s and its CPU."""
    url = server.db_url(adapter.db)
    adapter.seed_jobs(url, jobs)
    t0, results, cpu = run_processes(adapter.drain,
                                     [adapter.drain_args(url, i) for i in range(workers)])
    t_end = max(end for _, end in results)
    finished = adapter.done(url)
    if finished != jobs:
        raise RuntimeError(f"{adapter.system}: {finished} of {jobs} jobs finished")
    return jobs / (t_end - t0), cpu


def throughput(server: Server, plan: Plan, only: set[str] | None) -> list[QueueThroughput]:
    chosen = [a for a in adapters(plan.quick)
              if not only or a.system.split(" ")[0] in only]

    def jobs_of(a: Adapter) -> int:
        return plan.slow_jobs if a.slow else plan.jobs

    for db in {a.db for a in chosen}:
        url = server.fresh_db(db)
        if db == "bench_darkroom":
            migrate(url)
    # Per system, configuration and worker count: jobs/s, CPU µs per job and steal share
    # of each run.
    runs: dict[tuple[Adapter, int], tuple[list[float], list[float], list[float]]] = {
        (a, w): ([], [], []) for w in plan.workers for a in chosen}
    # Repeats go round-robin over every system, so a burst of load from a neighbour on
    # this shared machine hits all of them alike instead of one system's runs.
    for rep in range(plan.repeats):
        for workers in plan.workers:
            for a in chosen:
                # The slow ones take ~10x longer per job: one run each keeps the whole
                # benchmark under 15 minutes; the comparisons that decide targets repeat.
                if a.once and rep:
                    continue
                jobs = jobs_of(a)
                rate, cpu = run_throughput(server, a, workers, jobs)
                rates, cpu_us, steal = runs[(a, workers)]
                rates.append(rate)
                cpu_us.append(cpu.busy_s / jobs * 1e6)
                steal.append(cpu.steal_s / (jobs / rate))
                log(f"  [{rep + 1}/{plan.repeats}] {a.system:30} {a.config:34} {workers:>2}"
                    f" workers: {rate:8,.0f} jobs/s, {cpu_us[-1]:4.0f} µs CPU/job, steal"
                    f" {steal[-1]:.2f}")
    return [QueueThroughput.measured(a.system, a.config, w, jobs_of(a), *figures)
            for (a, w), figures in runs.items()]


# --- idle latency --------------------------------------------------------------------------------


async def _darkroom_latency_worker(barrier: Any, url: str, expected: int, limit: float,
                                   poll: float) -> dict[str, float]:
    # The worker's own plan mode (darkroom/worker.py `_open`).
    pool = await open_pool(url, min_size=1, max_size=1, name="latency", generic_plans=True)
    queue = _queue(pool, "latency")
    listen = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listen.execute(composed("listen", channel=NOTIFY_CHANNEL))
    claimed: dict[str, float] = {}
    try:
        barrier.wait()
        deadline = time.time() + limit
        while len(claimed) < expected and time.time() < deadline:
            leases = await queue.claim(32)
            now = time.time()
            if leases:
                claimed.update((str(lease.file_id), now) for lease in leases)
                for lease in leases:  # one fenced commit per job, as the worker does
                    await queue.complete(lease, noop_result(lease))
                continue
            # Idle: wake on the first NOTIFY, or poll anyway after `poll` seconds in case
            # a notification was lost (e.g. the listening connection was replaced).
            async for _ in listen.notifies(timeout=poll, stop_after=1):
                pass
        return claimed
    finally:
        await listen.close()
        await pool.close()


def darkroom_latency_worker(barrier: Any, url: str, expected: int, limit: float,
                            poll: float) -> dict[str, float]:
    """darkroom's idle worker: LISTEN darkroom_jobs on its own connection + fallback poll."""
    return asyncio.run(_darkroom_latency_worker(barrier, url, expected, limit, poll))


def seed_latency_worker(barrier: Any, url: str, expected: int,
                        limit: float) -> dict[str, float]:
    """The seed's loop: claim; when nothing is there, sleep 1 s."""
    claimed: dict[str, float] = {}
    with psycopg.connect(url, row_factory=dict_row) as conn:
        barrier.wait()
        deadline = time.time() + limit
        while len(claimed) < expected and time.time() < deadline:
            row = seed_claim(conn)
            if row is None:
                time.sleep(1.0)
                continue
            claimed[str(row["id"])] = time.time()
            seed_complete(conn, row)
    return claimed


async def _pgqueuer_latency_worker(barrier: Any, url: str, expected: int,
                                   limit: float) -> dict[str, float]:
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager

    queries, conn = await _pgqueuer_queries(url)
    qm = QueueManager(queries)
    started: dict[str, float] = {}

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        started[str(job.id)] = time.time()
        if len(started) >= expected:
            qm.shutdown.set()

    async def deadline() -> None:
        await asyncio.sleep(limit)
        qm.shutdown.set()

    try:
        barrier.wait()
        stop = asyncio.create_task(deadline())
        # Its defaults: LISTEN on its channel, batch_size 10, a 30 s fallback dequeue.
        await qm.run()
        stop.cancel()
        return started
    finally:
        await conn.close()


def pgqueuer_latency_worker(barrier: Any, url: str, expected: int,
                            limit: float) -> dict[str, float]:
    """PgQueuer's QueueManager with its default wake-up (LISTEN + fallback dequeue)."""
    return asyncio.run(_pgqueuer_latency_worker(barrier, url, expected, limit))


async def _procrastinate_latency_worker(barrier: Any, url: str, expected: int,
                                        limit: float) -> dict[str, float]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=url, min_size=1, max_size=PROCRASTINATE_CONCURRENCY + 2))
    started: dict[str, float] = {}
    enough = asyncio.Event()

    @app.task(name="noop", pass_context=True)
    async def noop(context: Any) -> None:
        started[str(context.job.id)] = time.time()
        if len(started) >= expected:
            enough.set()

    async with app.open_async():
        barrier.wait()
        # Its defaults: LISTEN/NOTIFY on, a 5 s fallback poll.
        worker = asyncio.create_task(app.run_worker_async(
            concurrency=PROCRASTINATE_CONCURRENCY, install_signal_handlers=False))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough.wait(), timeout=limit)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return started


def procrastinate_latency_worker(barrier: Any, url: str, expected: int,
                                 limit: float) -> dict[str, float]:
    """A Procrastinate worker with its default wake-up (LISTEN/NOTIFY + fallback poll)."""
    return asyncio.run(_procrastinate_latency_worker(barrier, url, expected, limit))


def _paced(n: int, rate: float) -> Iterator[int]:
    """Yields 0..n-1 at a steady `rate` per second (absolute schedule: no drift)."""
    start = time.time()
    for i in range(n):
        delay = start + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        yield i


async def _paced_async(n: int, rate: float) -> AsyncIterator[int]:
    """`_paced` for a producer on an event loop."""
    start = time.time()
    for i in range(n):
        delay = start + i / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i


def _latencies(enqueued: dict[str, float], claimed: dict[str, float]) -> list[float]:
    """enqueue → start of every job, in ms; a job never started counts as NaN."""
    return [(claimed[k] - t) * 1000 if k in claimed else math.nan
            for k, t in enqueued.items()]


def _run_with_producer(target: Callable[..., Any], args: tuple[Any, ...],
                       produce: Callable[[], dict[str, float]]) -> list[float]:
    """Runs one worker process and the producer (here) at the same time; answers each
    job's enqueue → start (`_latencies`)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    proc = ctx.Process(target=_worker_entry, args=(target, barrier, results, args))
    proc.start()
    try:
        barrier.wait(timeout=120)
        time.sleep(0.5)  # let the worker find the queue empty and go idle first
        enqueued = produce()
        claimed = results.get(timeout=120)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if isinstance(claimed, BaseException):
        raise RuntimeError(f"latency worker failed: {claimed!r}") from claimed
    return _latencies(enqueued, claimed)


def darkroom_latency(server: Server, plan: Plan) -> list[float]:
    """Producer: create pending cards, then `confirm` them (UPDATE + pg_notify, one txn)."""
    url = server.db_url("bench_darkroom")
    n = plan.latency_jobs
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["empty_queue"])
        ids = [r[0] for r in conn.execute(
            SQL["fill_pending"], {"originals": ORIGINALS, "n": n}).fetchall()]
        conn.execute(SQL["vacuum_analyze_cards"])

    def produce() -> dict[str, float]:
        async def go() -> dict[str, float]:
            pool = await open_pool(url, min_size=1, max_size=1, name="producer")
            queue = _queue(pool, "producer")
            enqueued: dict[str, float] = {}
            try:
                await queue.confirm_card(uuid.uuid4(), "bench", "warm-up")  # prepare, not timed
                async for i in _paced_async(n, plan.latency_rate):
                    # Taken before the statement: the latency includes the enqueue's own
                    # commit, so it can only be overstated, never flattered.
                    enqueued[str(ids[i])] = time.time()
                    await queue.confirm_card(ids[i], "bench", "v1")
            finally:
                await pool.close()
            return enqueued
        return asyncio.run(go())

    return _run_with_producer(darkroom_latency_worker,
                              (url, n, plan.latency_seconds + 20, 1.0), produce)


def seed_latency(server: Server, plan: Plan) -> list[float]:
    """Producer: INSERT a queued row, as the seed's API does on confirm (no NOTIFY)."""
    url = server.db_url("bench_seed")
    seed_prepare(url)
    n = plan.latency_jobs

    def produce() -> dict[str, float]:
        enqueued: dict[str, float] = {}
        with psycopg.connect(url, autocommit=True) as conn:
            for i in _paced(n, plan.latency_rate):
                fid = uuid.uuid4()
                enqueued[str(fid)] = time.time()
                conn.execute(SQL["seed_enqueue"], {"id": fid, "filename": f"f{i}",
                                                   "key": original_key(fid, None)})
        return enqueued

    return _run_with_producer(seed_latency_worker, (url, n, plan.latency_seconds + 20), produce)


def pgqueuer_latency(server: Server, plan: Plan) -> list[float]:
    """Producer: one `Queries.enqueue` per job (its INSERT notifies the channel)."""
    url = server.db_url("bench_pgqueuer")
    pgqueuer_seed_jobs(url, 0)
    n = plan.latency_jobs

    def produce() -> dict[str, float]:
        async def go() -> dict[str, float]:
            queries, conn = await _pgqueuer_queries(url)
            enqueued: dict[str, float] = {}
            try:
                async for _ in _paced_async(n, plan.latency_rate):
                    t = time.time()
                    ids = await queries.enqueue("noop", None)
                    enqueued[str(ids[0])] = t
            finally:
                await conn.close()
            return enqueued
        return asyncio.run(go())

    return _run_with_producer(pgqueuer_latency_worker, (url, n, plan.latency_seconds + 20),
                              produce)


def procrastinate_latency(server: Server, plan: Plan) -> list[float]:
    """Producer: one `defer_async` per job (its INSERT notifies the worker)."""
    url = server.db_url("bench_procrastinate")
    procrastinate_seed_jobs(url, 0)
    n = plan.latency_jobs

    def produce() -> dict[str, float]:
        async def go() -> dict[str, float]:
            app = _procrastinate_app(url, 2)
            enqueued: dict[str, float] = {}
            async with app.open_async():
                task = app.tasks["noop"]
                async for _ in _paced_async(n, plan.latency_rate):
                    t = time.time()
                    enqueued[str(await task.defer_async())] = t
            return enqueued
        return asyncio.run(go())

    return _run_with_producer(procrastinate_latency_worker, (url, n, plan.latency_seconds + 20),
                              produce)


# One per system: (how it wakes an idle worker, how its run is measured).
LATENCY: dict[str, tuple[str, Callable[[Server, Plan], list[float]]]] = {
    "darkroom": ("LISTEN darkroom_jobs + 1 s fallback poll", darkroom_latency),
    "pgqueuer": ("LISTEN (its default) + 30 s fallback dequeue", pgqueuer_latency),
    "procrastinate": ("LISTEN/NOTIFY (its default) + 5 s fallback poll",
                      procrastinate_latency),
    "seed": ("1 s sleep when empty", seed_latency),
}


def latency(server: Server, plan: Plan) -> dict[str, Any]:
    """Every system's idle enqueue → start in this one run, in `plan.latency_rounds`
    rounds that take the systems in turn, so that a burst of load from a neighbour hits
    them alike; the peers' only when installed (`make bench-install`)."""
    systems = {name: entry for name, entry in LATENCY.items()
               if name not in ("pgqueuer", "procrastinate")
               or importlib.util.find_spec(name) is not None}
    for name in LATENCY.keys() - systems.keys():
        log(f"  {name}: not installed (make bench-install); skipped")
    for name in systems.keys() & {"pgqueuer", "procrastinate"}:
        server.fresh_db(f"bench_{name}")
    per_round = replace(plan, latency_seconds=plan.latency_seconds / plan.latency_rounds)
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for rnd in range(plan.latency_rounds):
        for name, (_, measure) in systems.items():
            got = measure(server, per_round)
            samples[name] += got
            log(f"  [{rnd + 1}/{plan.latency_rounds}] {name}: "
                f"{sum(not math.isnan(v) for v in got)}/{len(got)} started")
    out: dict[str, Any] = {}
    for name, (how, _) in systems.items():
        started = [v for v in samples[name] if not math.isnan(v)]
        out[name] = latency_summary(started) | {"enqueued": len(samples[name]),
                                               "wake_up": how}
        log(f"  {name}: {out[name]}")
    return out


# --- claim time versus table size ----------------------------------------------------------------


def _fill_queued(conn: psycopg.Connection[Any], queued: int) -> None:
    """The same queued backlog on both table shapes (their queued columns are alike)."""
    conn.execute(SQL["fill_backlog"], {"originals": ORIGINALS, "n": queued})
    conn.execute(SQL["vacuum_analyze_cards"])


OWNERS = 1_000  # owners with work waiting in the claim-time tables
BULK_EVERY = 10  # one queued card in ten is bulk work


def _fill_queued_fair(conn: psycopg.Connection[Any], queued: int) -> None:
    """darkroom's backlog as fair share leaves it: OWNERS owners, each with its own line
    of stamps (owner i % OWNERS gets stamp i // OWNERS, so the lines interleave), one card
    in BULK_EVERY bulk. The claim must stay as cheap as with one owner."""
    conn.execute(SQL["fill_fair_backlog"], {"owners": OWNERS, "bulk": BULK_EVERY,
                                            "originals": ORIGINALS, "n": queued})
    conn.execute(SQL["vacuum_analyze_cards"])


def darkroom_fill(url: str, finished: int, queued: int) -> None:
    """`finished` ready cards (older) and `queued` due ones of OWNERS owners, in bulk."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["empty_queue"])
        conn.execute(SQL["fill_ready"], {"originals": ORIGINALS, "derived": DERIVED,
                                         "n": finished})
        _fill_queued_fair(conn, queued)


def seed_fill(url: str, finished: int, queued: int) -> None:
    seed_prepare(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["seed_fill_ready"], {"originals": ORIGINALS, "derived": DERIVED,
                                              "n": finished})
        _fill_queued(conn, queued)


def _timed_claims(url: str, claims: int, once: Callable[[psycopg.Connection[Any]], Any],
                  vacuum_every: int = 50) -> float:
    """Median ms of `claims` claims, each in a transaction that is rolled back.

    The rollback keeps the table's shape; the aborted row versions it leaves are vacuumed
    every `vacuum_every` claims (outside the timing) so they do not pile up either. The
    first 10 claims warm caches and prepared statements and are not counted.
    """
    times: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(claims + 10):
            if i and i % vacuum_every == 0:
                conn.execute(SQL["vacuum_cards"])
            with conn.transaction(force_rollback=True):
                t = time.perf_counter()
                rows = once(conn)
                elapsed = time.perf_counter() - t
            if not rows:
                raise RuntimeError("claim found nothing to claim")
            if i >= 10:
                times.append(elapsed * 1000)
    return statistics.median(times)


def darkroom_claim_once(n: int, sql: str | None = None
                        ) -> Callable[[psycopg.Connection[Any]], Any]:
    params = claim_params(n=n, max_attempts=3, lease_seconds=300.0, worker="bench",
                          claim=uuid.uuid4(), bulk_share=0.1)
    query = sql or QUERIES["claim"]

    def once(conn: psycopg.Connection[Any]) -> Any:
        # What Queue.claim sends: the same text, prepared on the server, with a claim id
        # of its own (issue 11: the worker draws it).
        return conn.execute(query, params | {"claim": uuid.uuid4()}, prepare=True).fetchall()
    return once


def seed_claim_once(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute(SQL["seed_select_due"]).fetchone()
    if row is None:
        return None
    return conn.execute(SQL["seed_lease"], {"id": row[0], "token": uuid.uuid4()}).fetchall()


def claim_times(server: Server, plan: Plan) -> list[dict[str, Any]]:
    """Claim time on a tiny table versus one with plan.finished_rows finished rows.

    The tiny table holds TINY queued rows rather than exactly 10, so that claim(32) gets
    full batches on both sides and the ratio compares like with like.
    """
    cases: list[tuple[str, str, Callable[[psycopg.Connection[Any]], Any]]] = [
        ("darkroom", "claim(1)", darkroom_claim_once(1)),
        ("darkroom", "claim(32)", darkroom_claim_once(32)),
        ("seed", "OR … ORDER BY created_at LIMIT 1", seed_claim_once),
    ]
    fills = {"darkroom": darkroom_fill, "seed": seed_fill}
    ms: dict[tuple[str, str, str], float] = {}
    for db, fill in fills.items():
        url = server.db_url(f"bench_{db}")
        # Each table is filled once per size and every claim variant measured on it. The
        # backlog size is darkroom's only: the seed's claim is already slow at "big".
        sizes = [("tiny", 0, TINY), ("big", plan.finished_rows, plan.queued_rows)]
        if db == "darkroom":  # issue 13: the finished rows and a backlog of 1,000 owners
            sizes.append(("backlog", plan.finished_rows, plan.backlog_rows))
        for size, finished, queued in sizes:
            fill(url, finished, queued)
            for system, what, once in cases:
                if system.split(" ")[0] == db:
                    ms[(system, what, size)] = _timed_claims(url, plan.claims, once)
    out = []
    for system, what, _ in cases:
        small, big = ms[(system, what, "tiny")], ms[(system, what, "big")]
        backlog = ms.get((system, what, "backlog"))
        out.append({"system": system, "claim": what, "ms_10_rows": small, "ms_big": big,
                    "ratio": big / small, "tiny_rows": TINY,
                    "finished_rows": plan.finished_rows, "queued_rows": plan.queued_rows,
                    "ms_backlog": backlog, "backlog_rows": plan.backlog_rows,
                    "backlog_ratio": backlog / small if backlog else None,
                    "owners_waiting": OWNERS if system == "darkroom" else None})
        log(f"  {system:30} {what:34} tiny {small:7.2f} ms   "
            f"{plan.finished_rows:,}+{plan.queued_rows:,} rows {big:7.2f} ms   x{big / small:.2f}"
            + (f"   +{plan.backlog_rows:,} queued of {OWNERS:,} owners {backlog:7.2f} ms"
               f"   x{backlog / small:.2f}" if backlog else ""))
    return out


# --- report ---------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 minute")
    parser.add_argument("--short", action="store_true",
                        help="10,000 jobs, 1 and 4 workers, 3 repeats (a quick target check)")
    parser.add_argument("--database-url", help="a PostgreSQL server to use (a superuser "
                        "URL: a database per system is created on it)")
    parser.add_argument("--only", help="comma-separated systems for the throughput part")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: "
                        "throughput,latency,claim")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    plan = QUICK if args.quick else SHORT if args.short else FULL
    skip = set(filter(None, args.skip.split(",")))
    only = set(args.only.split(",")) if args.only else None

    with contextlib.ExitStack() as stack:
        if args.database_url:
            server, where = Server(args.database_url), "external server"
        else:
            from darkroom.db import embedded

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dr-bench-")))
            # Stopped before its directory goes (the block's exits run last to first): the
            # stop at exit would find no cluster left to stop, and the server would run on.
            stack.callback(embedded.remove, tmp / "pg")
            server, where = Server(embedded.url(tmp / "pg", stop_on_exit=True)), "embedded"
        started = time.time()
        result = QueueResult(
            command=command("queue"),
            machine=machine(), postgres=server.describe(), server=where, plan=asdict(plan))
        log(f"PostgreSQL {result.postgres['server_version']} ({where}); "
            f"{result.machine['nproc']} CPUs: {result.machine['cpu']}")
        # Every part below needs darkroom's and the seed's databases to exist.
        for name in ("bench_darkroom", "bench_seed"):
            url = server.fresh_db(name)
        migrate(server.db_url("bench_darkroom"))
        seed_prepare(url)
        if "throughput" not in skip:
            log("throughput:")
            result.throughput = throughput(server, plan, only)
        if "latency" not in skip:
            log("latency:")
            result.latency = {name: load(QueueLatency, s)
                              for name, s in latency(server, plan).items()}
        if "claim" not in skip:
            log("claim time:")
            result.claim_time = [load(QueueClaim, c) for c in claim_times(server, plan)]
        result.elapsed_s = time.time() - started
        result.loadavg_at_end = list(os.getloadavg())
    publish("queue", result, args.out)
    print(f"({result.elapsed_s:.0f} s)")


if __name__ == "__main__":
    main()
