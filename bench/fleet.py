"""How far one PostgreSQL carries a fleet: thousands of simulated worker slots.

    .venv/bin/python -m bench.fleet [--slots 250 500 1000 2000 4000] [--window 20]
        [--slots-per-worker 4] [--lease 120] [--job-seconds 0.25 2.0] [--page-open] [--write-doc]

A simulated worker behaves as `darkroom worker` does towards the database, and does
nothing else: it keeps a lease ahead of each of its slots and refills them once used up
(`worker.claim_room`: a claim for the idle slots and a slot's worth ahead, so one claim
per slots' worth of jobs), "derives" by sleeping a uniformly drawn image time, and
publishes its one result alone or, when the leases kept ahead are used up, with the claim
that refills them (`Queue.complete_and_claim`, as the worker's completer does; it batches
only jobs that finish together, rare with a few slots and image times spread over
seconds); one
`Queue.heartbeat` per worker every lease/3 extends all its leases. Slots are asyncio tasks,
spread over a few processes that share connection pools (a real fleet has a pool per
worker; PostgreSQL's work per statement is the same). The backlog is seeded large enough
that no slot ever waits for work: the regime an autoscaler is for.

For each fleet size, after a warm-up, one window is measured:
- jobs/s completed, against the fleet's ideal (slots / mean image time);
- PostgreSQL's CPU per job: user+system time from /proc of every process of the server
  (bench/cpu.py), split into the job statements' backends, the heartbeats' backends
  (their own pool, so the split is exact) and the server's own processes;
- claim latency (client side: pool wait + statement), p50/p95/p99.

`--write-doc` draws docs/img/fleet.png and rewrites the `fleet` block of
docs/BENCHMARKS.md. The figures are only comparable within one run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.cpu import TICK, machine, machine_ticks, process_ticks
from bench.queue import Server, darkroom_seed_jobs, noop_result, run_processes
from bench.sql import SQL, composed
from bench.targets import FLEET_PG_US_PER_JOB
from darkroom.api.events import CHANNEL
from darkroom.db import embedded
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES
from darkroom.queue import Lease, Queue
from darkroom.worker import claim_room

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
JOBS_APP, HEARTBEAT_APP = "fleet-jobs", "fleet-heartbeat"
TAIL = 3.0  # seconds the fleet runs on after the window, while it is sampled
# CPU seconds one image costs a worker core (decode, resize, WebP encode), from
# docs/BENCHMARKS.md "Derivatives": the production pipeline's 3.64 img/s per core.
# bench/out/derive.json, when present, wins.
DEFAULT_CPU_PER_IMAGE = 1 / 3.64


def cpu_per_image() -> tuple[float, str]:
    path = OUT / "derive.json"
    try:
        data = json.loads(path.read_text())
        return float(data["child_cpu_seconds_per_image"]["one"]), "bench/out/derive.json"
    except (OSError, KeyError, ValueError, TypeError):
        return DEFAULT_CPU_PER_IMAGE, "docs/BENCHMARKS.md (Derivatives, 3.64 img/s per core)"


# --- one simulated worker --------------------------------------------------------------


class SimWorker:
    """One `darkroom worker` process as the database sees it: its slots, the leases it
    keeps ahead of them and the claims that refill those (`worker.claim_room`), each
    commit sent with the claim of the room it leaves (the worker's completer batches only
    jobs that finish together, rare with a few slots and image times spread over
    seconds)."""

    def __init__(self, jobs: Queue, beats: Queue, slots: int, rng: random.Random,
                 job_seconds: tuple[float, float], meter: Meter) -> None:
        self.jobs, self.beats, self.slots = jobs, beats, slots
        self.rng, self.job_seconds, self.meter = rng, job_seconds, meter
        self.held: dict[uuid.UUID, Lease] = {}  # every lease: decoding, committing, kept
        self.decoding = 0
        self.kept: list[Lease] = []
        self.claiming = 0
        self.wake = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def room(self) -> int:
        return claim_room(slots=self.slots, idle=self.slots - self.decoding,
                          jobs=len(self.held) - len(self.kept), kept=len(self.kept),
                          claiming=self.claiming)

    def take(self, leases: list[Lease]) -> None:
        for lease in leases:
            self.held[lease.file_id] = lease
        self.kept += leases
        while self.kept and self.decoding < self.slots:
            self.start(self.kept.pop(0))

    async def run(self) -> None:
        while True:
            if (free := self.room()) > 0:
                t = time.perf_counter()
                self.claiming += free
                try:
                    leases = await self.jobs.claim(free)
                finally:
                    self.claiming -= free
                self.meter.claimed(time.perf_counter() - t, len(leases))
                self.take(leases)
                if not leases:  # never in a sized run: the backlog outlasts the window
                    await asyncio.sleep(0.5)
                    continue
            await self.wake.wait()
            self.wake.clear()

    def start(self, lease: Lease) -> None:
        self.decoding += 1
        task = asyncio.create_task(self.job(lease))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def job(self, lease: Lease) -> None:
        await asyncio.sleep(self.rng.uniform(*self.job_seconds))
        # The result handed to the completer: the slot is free, a lease kept ahead starts.
        self.decoding -= 1
        self.take([])
        n = self.room()
        t = time.perf_counter()
        result = [(lease, noop_result(lease))]
        if n:
            self.claiming += n
            try:
                lost, leases = await self.jobs.complete_and_claim(result, n)
            finally:
                self.claiming -= n
            self.meter.claimed(time.perf_counter() - t, len(leases))
        else:
            lost, leases = await self.jobs.complete_many(result), []
        del self.held[lease.file_id]
        self.meter.completed(len(lost))
        self.take(leases)
        self.wake.set()

    async def heartbeat(self, interval: float) -> None:
        # A random phase, as workers started at different times have.
        await asyncio.sleep(self.rng.uniform(0, interval))
        while True:
            held = list(self.held.values())
            if held:
                lost = await self.beats.heartbeat(held)
                self.meter.beat(len(held), len(lost))
            await asyncio.sleep(interval)


class Meter:
    """Counts only inside the measured window."""

    def __init__(self) -> None:
        self.on = False
        self.jobs = self.lost = self.heartbeats = self.heartbeat_leases = 0
        self.claims: list[float] = []
        self.claimed_rows = 0

    def claimed(self, seconds: float, rows: int) -> None:
        if self.on:
            self.claims.append(seconds)
            self.claimed_rows += rows

    def completed(self, lost: int) -> None:
        if self.on:
            self.jobs += 1
            self.lost += lost

    def beat(self, leases: int, lost: int) -> None:
        if self.on:
            self.heartbeats += 1
            self.heartbeat_leases += leases
            self.lost += lost


async def _simulate(barrier: Any, url: str, workers: int, slots_per_worker: int,
                    lease: float, job_seconds: tuple[float, float], warmup: float,
                    window: float, conns: int, seed: int) -> dict[str, Any]:
    jobs_pool = await open_pool(make_conninfo(url, application_name=JOBS_APP),
                                min_size=conns, max_size=conns, name="fleet-jobs",
                                generic_plans=True)
    beats_pool = await open_pool(make_conninfo(url, application_name=HEARTBEAT_APP),
                                 min_size=2, max_size=2, name="fleet-heartbeat",
                                 generic_plans=True)

    def queue(pool: Any) -> Queue:
        return Queue(Database(pool), lease_seconds=lease, max_attempts=3, retry_base_seconds=1,
                     retry_cap_seconds=1, worker=f"fleet-{os.getpid()}")

    meter, rng = Meter(), random.Random(seed)
    sims = [SimWorker(queue(jobs_pool), queue(beats_pool), slots_per_worker,
                      random.Random(rng.random()), job_seconds, meter)
            for _ in range(workers)]
    barrier.wait()
    t0 = time.monotonic()
    # Held here: the event loop keeps only weak references to tasks.
    running = [asyncio.create_task(s.run()) for s in sims]
    running += [asyncio.create_task(s.heartbeat(lease / 3)) for s in sims]
    await asyncio.sleep(warmup)
    meter.on, cpu0 = True, time.process_time()
    await asyncio.sleep(t0 + warmup + window - time.monotonic())
    meter.on, cpu = False, time.process_time() - cpu0
    # Keep the backends alive until the sampler has read their CPU time. The fleet is
    # then abandoned, not drained: the process exits and its connections with it.
    await asyncio.sleep(TAIL)
    return {"role": "sim", "jobs": meter.jobs, "lost": meter.lost, "claims": meter.claims,
            "claimed_rows": meter.claimed_rows, "heartbeats": meter.heartbeats,
            "heartbeat_leases": meter.heartbeat_leases, "python_cpu_s": cpu,
            "tasks": len(running)}


def simulate(barrier: Any, *args: Any) -> dict[str, Any]:
    # Not asyncio.run: its teardown would wait on thousands of cancelled statements.
    # The loop is left as it is; the process ends right after answering.
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)
    result = loop.run_until_complete(_simulate(barrier, *args))
    # The abandoned connections complain, as they are collected, about their closed loop.
    sys.unraisablehook = lambda _unraisable: None
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    return result


# --- PostgreSQL's CPU, from /proc ------------------------------------------------------


def server_processes(conn: psycopg.Connection[Any]) -> tuple[int, dict[int, str]]:
    """(postmaster pid, {pid: application_name} of every process of the server)."""
    own = int(conn.execute(SQL["backend_pid"]).fetchone()[0])  # type: ignore[index]
    try:
        stat = Path(f"/proc/{own}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, {}  # the server runs elsewhere: no CPU figures
    postmaster = int(stat[1])
    names = dict(conn.execute(SQL["backend_names"]).fetchall())
    pids = {postmaster: "postmaster"}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                pids[int(entry.name)] = names.get(int(entry.name), "")
    return postmaster, pids


def sample(url: str) -> tuple[dict[int, str], dict[int, int], int]:
    with psycopg.connect(url, autocommit=True) as conn:
        _, pids = server_processes(conn)
    return pids, {pid: process_ticks(pid) for pid in pids}, machine_ticks()[0]


def watch(barrier: Any, url: str, warmup: float, window: float) -> dict[str, Any]:
    """The sampler process: PostgreSQL's CPU by kind of backend over the window."""
    barrier.wait()
    t0 = time.monotonic()
    time.sleep(warmup)
    _, ticks0, busy0 = sample(url)
    time.sleep(max(0.0, t0 + warmup + window - time.monotonic()))
    pids, ticks1, busy1 = sample(url)
    split = {"jobs": 0.0, "heartbeat": 0.0, "server": 0.0}
    for pid, name in pids.items():
        # A process started inside the window counts whole (it started at zero).
        used = (ticks1.get(pid, 0) - ticks0.get(pid, 0)) / TICK
        kind = {JOBS_APP: "jobs", HEARTBEAT_APP: "heartbeat"}.get(name, "server")
        split[kind] += max(used, 0.0)
    return {"role": "watch", "pg_cpu_s": split, "machine_busy_s": (busy1 - busy0) / TICK,
            "measured": bool(pids)}


def run(barrier: Any, role: Any, *args: Any) -> dict[str, Any]:
    """run_processes starts one target: this one, which runs the process's role."""
    result: dict[str, Any] = role(barrier, *args)
    return result


# --- a page open --------------------------------------------------------------------------


@contextmanager
def page_open(url: str, seconds: float) -> Iterator[None]:
    """As while a page is open: the pages' watch on for `seconds` (darkroom/watch.py), so
    every status change notifies, and one connection LISTENing and reading the notices, as
    an API process's."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["extend_card_watch"], {"seconds": seconds, "margin": 0})
    listener = psycopg.connect(url, autocommit=True)
    listener.execute(composed("listen", channel=CHANNEL))
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            for _ in listener.notifies(timeout=0.5):
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join()
        listener.close()


# --- the sweep -------------------------------------------------------------------------


def one_size(url: str, slots: int, args: argparse.Namespace) -> dict[str, Any]:
    per = args.slots_per_worker
    workers = max(1, slots // per)
    mean_job = sum(args.job_seconds) / 2
    ideal = workers * per / mean_job
    # Enough backlog that no slot runs dry before the window ends.
    darkroom_seed_jobs(url, int(ideal * (args.warmup + args.window + 5) * 1.3) + 1000)
    split = [workers // args.processes + (i < workers % args.processes)
             for i in range(args.processes)]
    jobs = [(simulate, url, n, per, args.lease, tuple(args.job_seconds), args.warmup,
             args.window, args.conns, i) for i, n in enumerate(split) if n]
    with page_open(url, args.warmup + args.window + 300) if args.page_open else nullcontext():
        _, out, _ = run_processes(run, [(watch, url, args.warmup, args.window), *jobs],
                                  timeout=args.warmup + args.window + 300)
    sims = [r for r in out if r["role"] == "sim"]
    [w] = [r for r in out if r["role"] == "watch"]
    done = sum(r["jobs"] for r in sims)
    claims = sorted(c for r in sims for c in r["claims"])
    pg = w["pg_cpu_s"]
    pg_total = sum(pg.values())

    def pct(p: float) -> float | None:
        return claims[min(len(claims) - 1, int(p * len(claims)))] * 1000 if claims else None

    row = {
        "slots": workers * per, "workers": workers, "ideal_jobs_per_s": ideal,
        "jobs_per_s": done / args.window, "jobs": done,
        "lost": sum(r["lost"] for r in sims),
        "claims": len(claims),
        "rows_per_claim": sum(r["claimed_rows"] for r in sims) / max(len(claims), 1),
        "claim_ms": {"p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)},
        "heartbeats": sum(r["heartbeats"] for r in sims),
        "heartbeat_leases": sum(r["heartbeat_leases"] for r in sims),
        "pg_cpu_s": pg, "pg_cores": pg_total / args.window,
        "pg_cpu_us_per_job": pg_total / done * 1e6 if done and w["measured"] else None,
        "heartbeat_share": pg["heartbeat"] / pg_total if pg_total else None,
        "sim_python_cpu_s": sum(r["python_cpu_s"] for r in sims),
        "machine_busy_cores": w["machine_busy_s"] / args.window,
    }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000])
    parser.add_argument("--slots-per-worker", type=int, default=4)
    parser.add_argument("--lease", type=float, default=120.0)
    parser.add_argument("--job-seconds", type=float, nargs=2, default=[0.25, 2.0],
                        metavar=("MIN", "MAX"))
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=2, help="simulator processes")
    parser.add_argument("--conns", type=int, default=12,
                        help="job-statement connections per simulator process")
    parser.add_argument("--database-url", help="a superuser URL (default: embedded)")
    parser.add_argument("--page-open", action="store_true",
                        help="as with a page open: the pages' watch on, its notices read")
    parser.add_argument("--write-doc", action="store_true")
    parser.add_argument("--from-json", action="store_true",
                        help="run nothing: redraw and rewrite the doc from bench/out/fleet.json")
    args = parser.parse_args()
    if args.from_json:
        write_doc(json.loads((OUT / "fleet.json").read_text()))
        return 0
    started = time.time()
    per_image, per_image_source = cpu_per_image()
    tmp = tempfile.mkdtemp(prefix="dr-fleet-")
    # atexit runs last-registered first: the embedded server is stopped, then its
    # directory removed (removing it first would leave the server running).
    atexit.register(shutil.rmtree, tmp, True)
    server = Server(args.database_url
                    or embedded.url(Path(tmp) / "pg", stop_on_exit=True))
    url = server.fresh_db("bench_fleet")
    migrate(url)
    info = server.describe()
    rows = []
    print("| slots | jobs/s | of ideal | PG cores | PG µs/job | heartbeat share "
          "| claim p50/p95/p99 ms | simulator cores | machine cores |", flush=True)
    for slots in args.slots:
        row = one_size(url, slots, args)
        rows.append(row)
        print(fmt_row(row), flush=True)
    result = {"bench": "fleet", "started": started, "argv": vars(args), "machine": machine(),
              "postgres": info, "cpu_per_image_s": per_image,
              "cpu_per_image_source": per_image_source, "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fleet.json").write_text(json.dumps(result, indent=2))
    print("\n" + "\n".join(summary(result)))
    if args.write_doc:
        write_doc(result)
    return 0


def fmt_row(r: dict[str, Any]) -> str:
    c = r["claim_ms"]
    us = r["pg_cpu_us_per_job"]
    share = r["heartbeat_share"]
    return (f"| {r['slots']:,} | {r['jobs_per_s']:,.0f} | "
            f"{r['jobs_per_s'] / r['ideal_jobs_per_s']:.0%} | {r['pg_cores']:.2f} | "
            f"{'–' if us is None else f'{us:,.0f}'} | "
            f"{'–' if share is None else f'{share:.1%}'} | "
            f"{c['p50'] or 0:.1f} / {c['p95'] or 0:.1f} / {c['p99'] or 0:.1f} | "
            f"{r['sim_python_cpu_s'] / max(r['jobs'], 1) * r['jobs_per_s']:.2f} | "
            f"{r['machine_busy_cores']:.2f} |")


def carried(result: dict[str, Any]) -> tuple[float, float, float] | None:
    """(µs of PostgreSQL CPU per job, images/s per PostgreSQL core, worker cores those
    images need) from the sizes that ran at ≥ 90% of their ideal rate: past that, the
    machine, not the fleet, set the pace and the figure would include queueing."""
    good = [r["pg_cpu_us_per_job"] for r in result["rows"]
            if r["pg_cpu_us_per_job"] and r["jobs_per_s"] >= 0.9 * r["ideal_jobs_per_s"]]
    if not good:
        good = [r["pg_cpu_us_per_job"] for r in result["rows"] if r["pg_cpu_us_per_job"]]
    if not good:
        return None
    us = statistics.median(good)
    per_core = 1e6 / us
    return us, per_core, per_core * result["cpu_per_image_s"]


def summary(result: dict[str, Any]) -> list[str]:
    c = carried(result)
    if c is None:
        return ["PostgreSQL's CPU was not measurable (a remote server?)."]
    us, per_core, cores = c
    met = "met" if us <= FLEET_PG_US_PER_JOB else "**not met**"
    return [f"PostgreSQL CPU per job {us:,.0f} µs (median of the sizes at ≥ 90% of ideal): "
            f"one PostgreSQL core carries about {per_core:,.0f} images/s, about "
            f"{cores:,.0f} worker cores of WebP encoding "
            f"({result['cpu_per_image_s'] * 1000:.0f} ms CPU per image, from "
            f"{result['cpu_per_image_source']})."
            + ("" if result["argv"].get("page_open") else
               f" Target ≤ {FLEET_PG_US_PER_JOB:,.0f} µs with no page open: {met}.")]


def write_doc(result: dict[str, Any]) -> None:
    from bench.splice import DOC, block, splice

    plot = draw(result)
    a = result["argv"]
    m, pg = result["machine"], result["postgres"]
    lines = [
        "", "Command:", "",
        "    .venv/bin/python -m bench.fleet --write-doc "
        + " ".join(f"--slots {' '.join(map(str, a['slots']))}".split())
        + (" --page-open" if a.get("page_open") else ""),
        "",
        f"Machine: {m['nproc']} CPUs · {m['cpu']} · PostgreSQL {pg['server_version']} "
        f"(embedded, fsync {pg['fsync']}, synchronous_commit {pg['synchronous_commit']}) · "
        f"load {m['loadavg_at_start'][0]:.1f} · "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(result['started']))}.",
        "",
        f"{a['slots_per_worker']} slots per simulated worker, images of "
        f"{a['job_seconds'][0]}–{a['job_seconds'][1]} s (uniform), lease {a['lease']:.0f} s "
        f"(a heartbeat per worker every {a['lease'] / 3:.0f} s), {a['warmup']:.0f} s warm-up "
        f"then a {a['window']:.0f} s window per size; per job: the fenced complete, alone "
        "or, once the leases a worker keeps ahead of its slots are used up, with the claim "
        "that refills them (one pipeline, one transaction; `worker.claim_room`), on "
        "connections that keep one plan per statement, as a worker's. Ideal = slots ÷ "
        "mean image time. PG cores = PostgreSQL's CPU seconds per second, all its "
        "processes. "
        + ("A page open: the pages' watch on and its notices read, as an API process's "
           "(`--page-open`)." if a.get("page_open") else
           "No page open: the pages' watch is off and no status change notifies "
           "(darkroom/watch.py)."),
        "",
        "| slots | jobs/s | of ideal | PG cores | PG µs/job | heartbeat share | "
        "claim p50 / p95 / p99 ms | simulator cores | machine cores |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(fmt_row(r) for r in result["rows"]),
        "", *summary(result), "",
        f"![Fleet size against jobs/s and PostgreSQL CPU]({plot})",
    ]
    doc = DOC.read_text()
    body = block("fleet", lines).replace("bench/report.py from bench/out/*.json",
                                         "bench/fleet.py --write-doc")
    DOC.write_text(splice(doc, "fleet", "Fleet (bench/fleet.py)", body))


def draw(result: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    slots = [r["slots"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.4, 4.8), dpi=100)
    fig.suptitle("Fleet simulator: one PostgreSQL, N worker slots", fontweight="bold")
    left.plot(slots, [r["ideal_jobs_per_s"] for r in rows], "--", color="#999",
              label="ideal (slots ÷ mean image time)")
    left.plot(slots, [r["jobs_per_s"] for r in rows], "o-", label="jobs/s completed")
    left.set_xscale("log")
    left.set_xticks(slots, [f"{n:,}" for n in slots])
    left.minorticks_off()
    left.set_xlabel("worker slots")
    left.set_ylabel("jobs/s")
    left.legend(loc="upper left")
    twin = left.twinx()
    twin.plot(slots, [r["claim_ms"]["p95"] or 0 for r in rows], "s:", color="#c44",
              label="claim p95, ms")
    twin.set_ylabel("claim p95, ms", color="#c44")
    pg = [r["pg_cpu_s"] for r in rows]
    w = result["argv"]["window"]
    bottom = [0.0] * len(rows)
    for kind, color in (("jobs", "#4c72b0"), ("heartbeat", "#dd8452"), ("server", "#999")):
        values = [p[kind] / w for p in pg]
        right.bar([str(s) for s in slots], values, bottom=bottom, color=color,
                  label={"jobs": "claim/register/complete backends",
                         "heartbeat": "heartbeat backends",
                         "server": "server processes"}[kind])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xlabel("worker slots")
    right.set_ylabel("PostgreSQL CPU, cores")
    right.legend(loc="upper left")
    m = result["machine"]
    fig.text(0.5, 0.01, f"{m['nproc']} CPUs · {m['cpu']} · "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(result['started']))} · "
             "shared machine: the simulator and PostgreSQL compete for the same cores",
             ha="center", fontsize=8, color="#444")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    img = ROOT / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    fig.savefig(img / "fleet.png")
    plt.close(fig)
    return "img/fleet.png"


if __name__ == "__main__":
    raise SystemExit(main())
