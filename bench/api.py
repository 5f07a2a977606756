"""HTTP API latency and ceiling: confirm at a fixed rate while a worker is busy, then flat out.

    .venv/bin/python -m bench.api [--rate 200] [--seconds 25] [--ceiling-seconds 10]

(Run as a module: as a script, bench/ would be on sys.path and bench/queue.py would
shadow the standard library's `queue`.)

Everything runs in one go on one machine: a private PostgreSQL (the pgserver wheel), the
local object store in a temp dir, a real `darkroom api` process (uvicorn) and a real
`darkroom worker --concurrency 1` process, both started as `python -m darkroom.cli ...`.
The load generator is this process (asyncio, uvloop and the small keep-alive client in
bench/loadgen.py), so it shares the cores with them.

1. Confirm latency, open loop: `POST /v1/files/{id}/confirm` at a fixed rate, each on a
   fresh pending card whose original is already stored (staged before the clock starts,
   straight through `Queue.create_file` + `store.put`). Sends are scheduled by the wall
   clock and latency runs from the *scheduled* send time to the response, so a stall of
   the server or of the generator is charged to the requests it delays (no coordinated
   omission). Once with the worker deriving a backlog of corpus photos (busy: one core
   taken by libvips), once with the worker stopped (idle).
2. The ceiling, closed loop (worker stopped): N clients each send the next request as
   soon as the previous one is answered, confirm (fresh cards) and GET /v1/files/{id}.

Alongside each phase: CPU used by the API, the worker (with its decoder children),
PostgreSQL, the generator and everything else on the machine (/proc), and the API's own
server-side histogram from /metrics, so generator and neighbour noise can be told apart
from the API's own time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pyvips

from bench.cpu import TICK, machine, machine_ticks, process_ticks
from bench.loadgen import ERRORS as LOAD_ERRORS
from bench.loadgen import LoadClient
from bench.results import ApiResult, load
from bench.runs import command
from bench.sections import publish
from bench.sql import SQL, composed
from bench.stats import percentile
from darkroom.db import embedded
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.migrations import migrate
from darkroom.keys import create_key_at
from darkroom.queue import ConfirmOutcome, Queue
from darkroom.storage import open_store
from tests.support.services import corpus_photos, free_port

ROOT = Path(__file__).resolve().parents[1]
OWNER = "bench"  # the cards the API is asked about
BACKLOG_OWNER = "backlog"  # the photos that keep the worker busy; never touched by the API
CONFIRM_ROUTE = "/v1/files/{file_id}/confirm"
GET_ROUTE = "/v1/files/{file_id}"


# --- the system under test --------------------------------------------------------------


# A fresh interpreter with the API's modules loaded and its app built, as `darkroom api`
# has them before its first request: the pause of one full collection (every request of
# the process waits for it), before and after the start-up heap is frozen.
_GC_PROBE = """
import gc, json, time
from darkroom.api.app import create_app
from darkroom.config import load_settings
app = create_app(load_settings(database_url="postgresql://unused/none"))
def full_pass_ms():
    times = []
    for _ in range(5):
        t = time.perf_counter(); gc.collect(); times.append((time.perf_counter() - t) * 1000)
    return min(times)
before, objects = full_pass_ms(), len(gc.get_objects())
gc.freeze()
print(json.dumps({"objects": objects, "unfrozen": before, "frozen": full_pass_ms()}))
"""


def gc_full_pass_ms() -> dict[str, float]:
    """One full collection's pause in an API process, unfrozen and frozen (see create_app)."""
    out = subprocess.run([sys.executable, "-c", _GC_PROBE], check=True, capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  a full collection in the API process: {figures['unfrozen']:.1f} ms over "
        f"{figures['objects']:,.0f} objects, {figures['frozen']:.2f} ms once frozen", flush=True)
    return figures


_METRICS_BASES: dict[str, str] = {}


class System:
    """A private PostgreSQL, one fresh database and store, and the darkroom processes."""

    def __init__(self, tmp: Path, api_pythonpath: str | None) -> None:
        self.tmp = tmp
        # The server's data dir (as root, handed to the server's own user; /tmp lets it in).
        self.base = Path(tempfile.mkdtemp(prefix="darkroom-bench-pg-"))
        self.pgdata = self.base / "pg"
        # embedded.url() without dropping the handle: close() stops the server and then
        # deletes its data dir, which would otherwise be left behind (~60 MB a run).
        self.server = embedded.start(self.pgdata, stop_on_exit=True)
        server_url = str(self.server.get_uri())
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(composed("drop_database", name="bench_api"))
            conn.execute(composed("create_database", name="bench_api"))
        self.db_url = psycopg.conninfo.make_conninfo(server_url, dbname="bench_api")
        migrate(self.db_url)
        store_dir = tmp / "objects"
        store_dir.mkdir()
        self.storage_url = store_dir.as_uri()
        self.env = {**os.environ, "DARKROOM_DATABASE_URL": self.db_url,
                    "DARKROOM_STORAGE_URL": self.storage_url, "DARKROOM_LEASE_SECONDS": "60",
                    "DARKROOM_POLL_SECONDS": "5"}
        self.api_env = dict(self.env)
        if api_pythonpath:  # A/B a patched copy of darkroom without touching the tree
            self.api_env["PYTHONPATH"] = os.pathsep.join(
                p for p in (api_pythonpath, os.environ.get("PYTHONPATH")) if p)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        # /metrics without a key, on a loopback listener of its own (an older darkroom
        # under --api-pythonpath ignores this and serves it on the API's port).
        self.metrics_port = free_port()
        self.api_env["DARKROOM_API_METRICS_PORT"] = str(self.metrics_port)
        _METRICS_BASES[self.base_url] = f"http://127.0.0.1:{self.metrics_port}"

    def _spawn(self, args: list[str], name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("wb")
        return subprocess.Popen([sys.executable, "-m", "darkroom.cli", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)

    def start_api(self) -> subprocess.Popen[bytes]:
        proc = self._spawn(["api", "--host", "127.0.0.1", "--port", str(self.port)], "api",
                           self.api_env)
        deadline = time.monotonic() + 60
        while True:  # ready = database and store reachable, as a load balancer would see it
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return proc
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError((self.tmp / "api.log").read_text())
            time.sleep(0.1)

    def start_worker(self) -> subprocess.Popen[bytes]:
        proc = self._spawn(["worker", "--concurrency", "1", "--name", "bench"], "worker",
                           self.env)
        # Busy must mean deriving, not importing: wait for its log line (decoders warm).
        path = self.tmp / "worker.log"
        deadline = time.monotonic() + 60
        while b"worker started" not in path.read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(path.read_text())
            time.sleep(0.05)
        return proc

    def close(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.base, ignore_errors=True)

    def postmaster_pid(self) -> int:
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- staging -----------------------------------------------------------------------------


def tiny_jpeg() -> bytes:
    # The API never decodes, so the confirm cards' originals only need to exist; a real
    # (small) image keeps them valid should a worker ever reach them.
    return bytes(pyvips.Image.black(64, 64).jpegsave_buffer(Q=80))


def corpus(n: int) -> list[tuple[bytes, str]]:
    files = corpus_photos()
    types = {".jpg": "image/jpeg", ".png": "image/png"}
    return [(files[i % len(files)].read_bytes(), types[files[i % len(files)].suffix])
            for i in range(n)]


async def stage(db_url: str, storage_url: str, owner: str,
                images: list[tuple[bytes, str]]) -> list[tuple[uuid.UUID, str]]:
    """Pending cards with their originals stored: (id, version) per image."""
    store = open_store(storage_url)
    pool = await open_pool(db_url, min_size=4, max_size=4)
    q = Queue(Database(pool), lease_seconds=60, max_attempts=3, retry_base_seconds=1,
              retry_cap_seconds=1)
    # Concurrent: each put fsyncs three times, so one at a time would take minutes.
    gate = asyncio.Semaphore(8)

    async def one(data: bytes, content_type: str) -> tuple[uuid.UUID, str]:
        async with gate:
            card = await q.create_file(owner=owner, filename="bench", content_type=content_type,
                                       size=len(data))
            version = await asyncio.to_thread(store.put, card.original_key, data,
                                              content_type=content_type)
            return card.id, version

    try:
        return list(await asyncio.gather(*(one(d, t) for d, t in images)))
    finally:
        await pool.close()


async def confirm_direct(db_url: str, staged: list[tuple[uuid.UUID, str]], owner: str) -> None:
    """The backlog is queued behind the API's back: it is the load, not what is measured."""
    pool = await open_pool(db_url, min_size=1, max_size=1)
    q = Queue(Database(pool), lease_seconds=60, max_attempts=3, retry_base_seconds=1,
              retry_cap_seconds=1)
    try:
        for file_id, version in staged:
            assert (await q.confirm_card(file_id, owner, version)).outcome is ConfirmOutcome.QUEUED
    finally:
        await pool.close()


def backlog_counts(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(SQL["status_counts_of_owner"], {"owner": BACKLOG_OWNER}).fetchall()
    return {str(status): int(n) for status, n in rows}


# --- observation -------------------------------------------------------------------------


def postgres_activity(db_url: str) -> dict[str, int]:
    """Counters of PostgreSQL's own background work, to tell its stalls from the API's:
    a checkpoint's final fsyncs or a vacuum's writes can hold up every commit for a while."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        ckpt = conn.execute(SQL["checkpoints_before_17"] if conn.info.server_version < 170000
                            else SQL["checkpoints"]).fetchone()
        vac = conn.execute(SQL["autovacuum_runs"]).fetchone()
    return {"checkpoints": int(ckpt[0]) if ckpt else 0,
            "autovacuums": int(vac[0]) if vac else 0}


def _tree(pid: int) -> Iterator[int]:
    yield pid
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                    yield from _tree(int(child))


def _tree_ticks(pid: int | None) -> int:
    return 0 if pid is None else sum(process_ticks(p) for p in _tree(pid))


@dataclass
class CpuWatch:
    """CPU shares (in cores) over a phase, split by who used them. Processes that exit
    during the phase take their ticks with them, so "others" is an upper bound."""

    pids: dict[str, int | None]
    start: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0
    seconds: float = 0.0
    cores: dict[str, float] = field(default_factory=dict)

    def _sample(self) -> dict[str, int]:
        busy, steal, total = machine_ticks()
        sample = {name: _tree_ticks(pid) for name, pid in self.pids.items()}
        sample["generator"] = process_ticks(os.getpid())
        sample["machine"], sample["steal"], sample["total"] = busy, steal, total
        return sample

    def __enter__(self) -> CpuWatch:
        self.start = self._sample()
        self.wall = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        seconds = self.seconds = time.monotonic() - self.wall
        used = {k: (end[k] - self.start[k]) / TICK / seconds for k in end if k != "total"}
        ours = sum(v for k, v in used.items() if k not in ("machine", "steal"))
        used["others"] = max(0.0, used["machine"] - ours)
        self.cores = {k: round(v, 2) for k, v in used.items()}


# Greedy up to the last "}": route labels are templates and contain braces themselves.
_BUCKET = re.compile(
    r"^darkroom_http_request_duration_seconds_(bucket|sum|count)\{(.*)\} (\S+)$", re.MULTILINE)


def server_histogram(base_url: str, route: str, method: str) -> dict[str, float]:
    """Cumulative buckets ("le" -> count), "sum" and "count" of one route, from /metrics
    (on the metrics listener, or on the API's port for a darkroom that has none)."""
    try:
        text = httpx.get(f"{_metrics_base(base_url)}/metrics", timeout=10).text
    except httpx.ConnectError:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for kind, labels, value in _BUCKET.findall(text):
        if f'route="{route}"' not in labels or f'method="{method}"' not in labels:
            continue
        if kind == "bucket":
            le = re.search(r'le="([^"]+)"', labels)
            assert le is not None
            out[le.group(1)] = float(value)
        else:
            out[kind] = float(value)
    return out


def _metrics_base(base_url: str) -> str:
    return _METRICS_BASES.get(base_url, base_url)


def server_side(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The API's own view of a phase: request count, mean, and share within 25 ms."""
    count = after.get("count", 0) - before.get("count", 0)
    if count <= 0:
        return {"count": 0}
    within = after.get("0.025", 0) - before.get("0.025", 0)
    return {"count": int(count),
            "mean_ms": round((after["sum"] - before.get("sum", 0)) / count * 1000, 2),
            "within_25ms": round(within / count, 4)}


# --- load --------------------------------------------------------------------------------


def summary(latencies_ms: list[float], seconds: float, statuses: collections.Counter[str],
            bad: int) -> dict[str, Any]:
    lat = sorted(latencies_ms)
    return {"requests": len(lat), "seconds": round(seconds, 2),
            "rps": round(len(lat) / seconds, 1) if seconds else 0.0,
            "p50_ms": round(percentile(lat, 0.50), 2), "p95_ms": round(percentile(lat, 0.95), 2),
            "p99_ms": round(percentile(lat, 0.99), 2), "max_ms": round(lat[-1], 2) if lat else None,
            "statuses": dict(statuses), "unexpected": bad}


Send = Callable[[LoadClient, Any], Awaitable[bool]]


def confirm_sender() -> Send:
    async def send(client: LoadClient, target: tuple[uuid.UUID, str]) -> bool:
        file_id, version = target
        r = await client.post(f"/v1/files/{file_id}/confirm", json={"version": version})
        # A 202 whose card is already past `queued` would mean the answer waited for work.
        return (r.status_code == 202 and r.json()["status"] == "queued"
                and r.headers.get("location") == f"/v1/files/{file_id}")
    return send


def get_sender() -> Send:
    async def send(client: LoadClient, file_id: uuid.UUID) -> bool:
        r = await client.get(f"/v1/files/{file_id}")
        return r.status_code == 200 and r.json()["id"] == str(file_id)
    return send


async def _timed(client: LoadClient, send: Send, target: Any,
                 statuses: collections.Counter[str]) -> bool:
    try:
        ok = await send(client, target)
    except LOAD_ERRORS as exc:
        statuses[type(exc).__name__] += 1
        return False
    statuses["ok" if ok else "unexpected"] += 1
    return ok


async def open_loop(client: LoadClient, send: Send, targets: list[Any],
                    rate: float) -> dict[str, Any]:
    """One request every 1/rate s by the clock, whatever the answers are doing."""
    # perf_counter, not loop.time(): uvloop's clock has millisecond resolution.
    clock = time.perf_counter
    latencies: list[float] = []
    lags: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()

    async def one(target: Any, scheduled: float) -> None:
        lags.append((clock() - scheduled) * 1000)
        await _timed(client, send, target, statuses)
        # From the scheduled time: a late send (generator or pool busy) counts as latency.
        latencies.append((clock() - scheduled) * 1000)

    start = clock() + 0.05
    tasks = []
    for i, target in enumerate(targets):
        scheduled = start + i / rate
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(target, scheduled)))
    await asyncio.gather(*tasks)
    result = summary(latencies, len(targets) / rate, statuses,
                     sum(v for k, v in statuses.items() if k != "ok"))
    # Offered rate vs what was served: a server that cannot keep up finishes late.
    result["wall_seconds"] = round(clock() - start, 2)
    result["rps"] = round(len(targets) / result["wall_seconds"], 1)
    lag = sorted(lags)
    # How late the generator itself dispatched: the share of latency that is not the API's.
    result["send_lag_p99_ms"] = round(percentile(lag, 0.99), 2)
    result["send_lag_max_ms"] = round(lag[-1], 2)
    return result


async def closed_loop(make_client: Callable[[], LoadClient], send: Send,
                      targets: Iterator[Any], clients: int, seconds: float) -> dict[str, Any]:
    """`clients` tasks, each sending its next request when the previous one is answered.

    Each task has its own one-connection client, so no task waits for another's
    connection: the figure is the API's, not the generator's pool's.
    """
    clock = time.perf_counter
    latencies: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    ends: list[float] = []
    pool = [make_client() for _ in range(clients)]
    start = clock()
    deadline = start + seconds

    async def client_task(client: LoadClient) -> None:
        async with client:
            for target in targets:  # shared iterator: every target is used once
                if clock() >= deadline:
                    break
                t0 = clock()
                await _timed(client, send, target, statuses)
                latencies.append((clock() - t0) * 1000)
            ends.append(clock())

    await asyncio.gather(*(client_task(c) for c in pool))
    # Ends early if the staged cards run out; the rate is over the time actually spent.
    return summary(latencies, max(ends) - start, statuses,
                   sum(v for k, v in statuses.items() if k != "ok"))


def http_client(base_url: str, key: str, connections: int) -> LoadClient:
    # Waiting for a free connection is part of the measured latency, not an error.
    return LoadClient(base_url, {"Authorization": f"Bearer {key}"}, connections)


# --- the run -----------------------------------------------------------------------------


@dataclass
class Plan:
    rate: float
    seconds: float
    warmup_seconds: float
    ceiling_seconds: float
    clients: list[int]
    ceiling_cards: int
    backlog: int
    connections: int
    worker_nice: int


async def measured(name: str, base_url: str, route: str, method: str,
                   pids: dict[str, int | None],
                   run: Callable[[], Awaitable[dict[str, Any]]],
                   db_url: str | None = None) -> dict[str, Any]:
    before = await asyncio.to_thread(server_histogram, base_url, route, method)
    pg_before = await asyncio.to_thread(postgres_activity, db_url) if db_url else {}
    load = os.getloadavg()[0]
    with CpuWatch(pids) as cpu:
        result = await run()
    after = await asyncio.to_thread(server_histogram, base_url, route, method)
    if db_url:
        pg_after = await asyncio.to_thread(postgres_activity, db_url)
        result["postgres_during_phase"] = {k: pg_after[k] - pg_before[k] for k in pg_after}
    result["server"] = server_side(before, after)
    result["cpu_cores"] = cpu.cores
    # CPU per request hardly depends on what the neighbours do, unlike latency: the
    # figure to compare across runs on a shared machine.
    if result["requests"]:
        result["api_cpu_ms_per_request"] = round(
            cpu.cores["api"] * cpu.seconds / result["requests"] * 1000, 2)
    result["loadavg_1m_before"] = round(load, 2)
    print(f"  {name}: {result['requests']} req, {result['rps']} req/s, p50 {result['p50_ms']} "
          f"p99 {result['p99_ms']} max {result['max_ms']} ms, {result['statuses']}, "
          f"API CPU {result.get('api_cpu_ms_per_request')} ms/req, server {result['server']}, "
          f"cpu {cpu.cores}, postgres {result.get('postgres_during_phase')}", flush=True)
    return result


async def run(system: System, plan: Plan) -> dict[str, Any]:
    key = await create_key_at(system.db_url, OWNER)
    per_phase = int(plan.rate * plan.seconds)
    warm = int(plan.rate * plan.warmup_seconds)
    n_confirm = 2 * (warm + per_phase) + len(plan.clients) * plan.ceiling_cards
    print(f"staging {plan.backlog} corpus photos and {n_confirm} pending cards ...", flush=True)
    t0 = time.monotonic()
    backlog = await stage(system.db_url, system.storage_url, BACKLOG_OWNER, corpus(plan.backlog))
    cards = await stage(system.db_url, system.storage_url, OWNER,
                        [(tiny_jpeg(), "image/jpeg")] * n_confirm)
    print(f"  staged in {time.monotonic() - t0:.0f} s", flush=True)
    pool = iter(cards)

    def take(n: int) -> list[tuple[uuid.UUID, str]]:
        return list(itertools.islice(pool, n))

    api = system.start_api()
    results: dict[str, Any] = {}
    try:
        async with http_client(system.base_url, key, plan.connections) as client:
            pg = system.postmaster_pid()
            confirm = confirm_sender()

            # -- 1a. busy worker ----------------------------------------------------------
            worker = system.start_worker()
            if plan.worker_nice:
                # Children forked later inherit it from the worker process.
                for pid in _tree(worker.pid):
                    os.setpriority(os.PRIO_PROCESS, pid, plan.worker_nice)
            try:
                await confirm_direct(system.db_url, backlog, BACKLOG_OWNER)
                pids: dict[str, int | None] = {"api": api.pid, "worker": worker.pid,
                                               "postgres": pg}
                # Warm-up (not recorded): pool connections opened, statements prepared.
                await open_loop(client, confirm, take(warm), plan.rate)
                before = backlog_counts(system.db_url)
                results["confirm_busy"] = await measured(
                    f"confirm @{plan.rate:g}/s, worker busy", system.base_url, CONFIRM_ROUTE,
                    "POST", pids, lambda: open_loop(client, confirm, take(per_phase), plan.rate),
                    system.db_url)
                after = backlog_counts(system.db_url)
                # Proof that the worker was deriving throughout: photos finished during the
                # phase, and photos still waiting at its end.
                results["confirm_busy"]["worker"] = {
                    "derived_during_phase": after.get("ready", 0) - before.get("ready", 0),
                    "rejected_during_phase": after.get("rejected", 0)
                    - before.get("rejected", 0),
                    "backlog_queued_at_end": after.get("queued", 0)}
                print(f"    worker: {results['confirm_busy']['worker']}", flush=True)
            finally:
                stop(worker)

            # -- 1b. worker stopped -------------------------------------------------------
            pids = {"api": api.pid, "worker": None, "postgres": pg}
            await open_loop(client, confirm, take(warm), plan.rate)
            results["confirm_idle"] = await measured(
                f"confirm @{plan.rate:g}/s, worker stopped", system.base_url, CONFIRM_ROUTE,
                "POST", pids, lambda: open_loop(client, confirm, take(per_phase), plan.rate),
                system.db_url)

        # -- 2. the ceiling (worker stopped) ----------------------------------------------
        gets = [file_id for file_id, _ in cards[: 2 * (warm + per_phase)]]

        def one_connection() -> LoadClient:
            return http_client(system.base_url, key, 1)

        for clients in plan.clients:
            confirm_targets = iter(take(plan.ceiling_cards))
            results[f"ceiling_confirm_{clients}"] = await measured(
                f"confirm closed loop, {clients} clients", system.base_url, CONFIRM_ROUTE,
                "POST", pids, lambda n=clients, t=confirm_targets: closed_loop(  # type: ignore[misc]
                    one_connection, confirm, t, n, plan.ceiling_seconds))
            results[f"ceiling_get_{clients}"] = await measured(
                f"GET closed loop, {clients} clients", system.base_url, GET_ROUTE, "GET",
                pids, lambda n=clients: closed_loop(  # type: ignore[misc]
                    one_connection, get_sender(), itertools.cycle(gets), n,
                    plan.ceiling_seconds))
    finally:
        stop(api)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    parser.add_argument("--seconds", type=float, default=25.0, help="each open-loop phase")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--ceiling-seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--ceiling-cards", type=int, default=6000,
                        help="fresh cards staged per closed-loop confirm phase")
    parser.add_argument("--connections", type=int, default=32,
                        help="open-loop client connection pool")
    parser.add_argument("--backlog", type=int, default=0,
                        help="corpus photos for the worker (default: enough for the phase)")
    parser.add_argument("--worker-nice", type=int, default=0,
                        help="renice the worker and its decoders (A/B of a proposed change)")
    parser.add_argument("--api-pythonpath", default=None,
                        help="prepend to the API's PYTHONPATH (to A/B a patched darkroom)")
    args = parser.parse_args()
    # ~3 photos/s for one slot (bench/out/worker.json); twice that so it never runs dry.
    backlog = args.backlog or int(6 * (args.seconds + args.warmup_seconds + 10))
    plan = Plan(rate=args.rate, seconds=args.seconds, warmup_seconds=args.warmup_seconds,
                ceiling_seconds=args.ceiling_seconds, clients=args.clients,
                ceiling_cards=args.ceiling_cards, backlog=backlog,
                connections=args.connections, worker_nice=args.worker_nice)
    info = machine() | {"generator": "bench/loadgen.py (keep-alive HTTP/1.1 on uvloop)",
                        "worker_nice": args.worker_nice}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="darkroom-bench-"))
        system = System(Path(tmp), args.api_pythonpath)
        stack.callback(system.close)
        # uvloop (uvicorn's own loop, already installed) trims the generator's CPU share.
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            results = runner.run(run(system, plan))
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    gc_pause = gc_full_pass_ms()
    data = {"machine": info, "plan": vars(plan), "results": results,
            "gc_full_pass_ms": gc_pause,
            "command": command("api")}
    result = load(ApiResult, data)
    publish("api", result)


if __name__ == "__main__":
    main()
