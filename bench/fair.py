"""Fair-share benchmark: owner B's wait while owner A's backlog drains, FIFO against fair.

One run, one PostgreSQL, the real queue statements (confirm stamps, claim, fenced
complete). Two worker slots in one process claim one card at a time, "work" for a fixed
time (a sleep: the job's length is the unit of the result), and complete it. Owner A
confirms a backlog; while it drains, owner B uploads one photo every `b_interval`.
Policies, run interleaved (fifo, fair, fair_bulk, fifo, fair, ...):

  fifo       B's cards are stamped in A's line (one owner), which is exactly first-in,
             first-out: what every card got before fair share.
  fair       A and B are owners of their own (both interactive).
  fair_bulk  A imports with `--bulk`; B uploads interactively.

Measures B's confirm -> processing latency (the card's available_at at confirm to the
`claimed` event, both the database's clock), A's throughput (A's cards / the time from A's
first claim to A's last publication), and the mean job duration; then, with --claims,
claim time with 1,000 owners waiting (bench.queue's claim benchmark, darkroom only).
Writes bench/out/fair.json (bench/results.py `FairResult`) and prints it through its
renderer (bench/sections.py `fair_section`); `bench.report` draws docs/img/fair_latency.png.

    .venv/bin/python -m bench.fair [--quick] [--database-url URL] [--no-claims]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

from bench.cpu import machine
from bench.queue import (
    DARKROOM_EMPTY,
    OWNERS,
    TINY,
    Server,
    _queue,
    _timed_claims,
    darkroom_claim_once,
    darkroom_fill,
    log,
    noop_result,
)
from bench.results import FairClaim, FairConfirmRate, FairResult, FairRun, FairSummary, save
from bench.runs import BY_NAME, command
from bench.sections import publish
from bench.stats import percentile
from darkroom.db.connection import open_pool
from darkroom.db.migrations import migrate
from darkroom.queue import Priority, Queue

OUT = BY_NAME["fair"].json_path
POLICIES = ("fifo", "fair", "fair_bulk")
SLOTS = 2


@dataclass(frozen=True)
class Plan:
    a_jobs: int  # A's backlog
    job_seconds: float  # one job's work
    b_interval: float  # B uploads one card this often while A's backlog drains
    repeats: int  # of each policy, interleaved
    finished_rows: int  # claim time: finished rows ...
    backlog_rows: int  # ... and queued rows of 1,000 owners
    claims: int
    quick: bool = False


# B's uploads are a trickle (about 3% of the slots), as one user's photos during someone
# else's import: A's throughput can then stay near FIFO's, where B's few jobs all ran
# after A's backlog. Jobs of 100 ms keep this shared machine's scheduling hiccups small
# against the job length that the latency target is measured in.
FULL = Plan(a_jobs=500, job_seconds=0.1, b_interval=1.5, repeats=3,
            finished_rows=1_000_000, backlog_rows=200_000, claims=300)
QUICK = Plan(a_jobs=80, job_seconds=0.02, b_interval=0.25, repeats=1,
             finished_rows=20_000, backlog_rows=5_000, claims=30, quick=True)


async def _upload(q: Queue, owner: str, name: str, priority: Priority) -> uuid.UUID:
    card = await q.create_file(owner=owner, filename=name, content_type="image/jpeg", size=1,
                               priority=priority)
    await q.confirm_card(card["id"], owner, "v1")
    return uuid.UUID(str(card["id"]))


async def _slot(q: Queue, stop: asyncio.Event, job_seconds: float) -> None:
    while not stop.is_set():
        leases = await q.claim(1)
        if not leases:
            await asyncio.sleep(0.002)
            continue
        await asyncio.sleep(job_seconds)  # the work
        await q.complete(leases[0], noop_result(leases[0]))


async def one_run(url: str, policy: str, plan: Plan) -> FairRun:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DARKROOM_EMPTY)
    pool = await open_pool(url, min_size=SLOTS + 1, max_size=SLOTS + 1, name="bench-fair")
    try:
        queues = [_queue(pool, f"slot{i}") for i in range(SLOTS + 1)]
        api = queues[-1]
        a_priority = Priority.BULK if policy == "fair_bulk" else Priority.INTERACTIVE
        # With FIFO, B's cards join A's line: one owner is first-in, first-out.
        b_owner = "a" if policy == "fifo" else "b"
        a_ids = [await _upload(api, "a", f"a{i}", a_priority) for i in range(plan.a_jobs)]
        stop = asyncio.Event()
        slots = [asyncio.create_task(_slot(q, stop, plan.job_seconds)) for q in queues[:-1]]
        b_ids: list[uuid.UUID] = []
        # B uploads while at least a fifth of A's backlog is still waiting.
        while True:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM archive_files WHERE status = 'queued'"
                                   " AND id = ANY(%s)", (a_ids,)).fetchone()
            if row is None or row[0] < plan.a_jobs // 5:
                break
            b_ids.append(await _upload(api, b_owner, f"b{len(b_ids)}", Priority.INTERACTIVE))
            await asyncio.sleep(plan.b_interval)
        while True:  # drain
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM archive_files WHERE status <> 'ready'"
                                   ).fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*slots)
    finally:
        await pool.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT f.id, f.available_at, c.created_at AS claimed, r.created_at AS ready"
            " FROM archive_files f"
            " JOIN archive_events c ON c.file_id = f.id AND c.kind = 'claimed'"
            " JOIN archive_events r ON r.file_id = f.id AND r.kind = 'ready'").fetchall()
    by_id = {r[0]: r for r in rows}
    b_wait = sorted((by_id[i][2] - by_id[i][1]).total_seconds() for i in b_ids)
    a_rows = [by_id[i] for i in a_ids]
    a_span = (max(r[3] for r in a_rows) - min(r[2] for r in a_rows)).total_seconds()
    job = statistics.fmean((r[3] - r[2]).total_seconds() for r in rows)
    span = (max(r[3] for r in rows) - min(r[2] for r in rows)).total_seconds()
    return FairRun(policy=policy, b_cards=len(b_ids), b_wait_p50_s=_pct(b_wait, 0.50),
                   b_wait_p95_s=_pct(b_wait, 0.95), b_wait_max_s=_pct(b_wait, 1.0),
                   a_jobs_per_s=plan.a_jobs / a_span, all_jobs_per_s=len(rows) / span,
                   mean_job_s=job, b_wait_s=b_wait)


def _pct(values: list[float], q: float) -> float | None:
    """`q` of sorted `values`; None without any (B uploaded nothing)."""
    return percentile(values, q) if values else None


def summarize(runs: list[FairRun]) -> dict[str, FairSummary]:
    out: dict[str, FairSummary] = {}
    for policy in POLICIES:
        mine = [r for r in runs if r.policy == policy]
        waits = sorted(w for r in mine for w in r.b_wait_s)
        out[policy] = FairSummary(
            b_cards=len(waits), b_wait_p50_s=_pct(waits, 0.5),
            b_wait_p95_s=_pct(waits, 0.95), b_wait_max_s=_pct(waits, 1.0),
            a_jobs_per_s=statistics.median(r.a_jobs_per_s for r in mine),
            all_jobs_per_s=statistics.median(r.all_jobs_per_s for r in mine),
            mean_job_s=statistics.fmean(r.mean_job_s for r in mine))
    return out


CONFIRM_CLIENTS = 8


async def _confirm_rate(url: str, owners: int, n: int) -> float:
    """Confirms per second by CONFIRM_CLIENTS concurrent clients, cards spread over
    `owners` owners: one owner's confirms queue on its clock row (each holds it until its
    commit), many owners' do not."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DARKROOM_EMPTY)
    pool = await open_pool(url, min_size=CONFIRM_CLIENTS, max_size=CONFIRM_CLIENTS,
                           name="bench-confirm")
    try:
        q = _queue(pool, "bench-confirm")
        cards = [await q.create_file(owner=f"o{i % owners}", filename="c", size=1,
                                     content_type="image/jpeg") for i in range(n)]
        todo = iter(cards)

        async def client() -> None:
            for card in todo:
                await q.confirm_card(card["id"], card["owner"], "v1")

        t = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONFIRM_CLIENTS)))
        return n / (time.perf_counter() - t)
    finally:
        await pool.close()


def confirm_rates(url: str, plan: Plan) -> list[FairConfirmRate]:
    n = 300 if plan.repeats == 1 else 2_000
    out = []
    for rep in range(plan.repeats):  # interleaved
        for owners in (1, CONFIRM_CLIENTS):
            rate = asyncio.run(_confirm_rate(url, owners, n))
            log(f"  confirms, {owners} owner(s): {rate:,.0f}/s")
            out.append(FairConfirmRate(owners=owners, clients=CONFIRM_CLIENTS, confirms=n,
                                       rep=rep, per_s=rate))
    return out


def claim_times(url: str, plan: Plan) -> list[FairClaim]:
    """bench.queue's claim benchmark, darkroom only: a tiny table against
    `finished_rows` finished cards plus `backlog_rows` queued of 1,000 owners."""
    cases = [("claim(1)", darkroom_claim_once(1)), ("claim(32)", darkroom_claim_once(32))]
    ms: dict[tuple[str, str], float] = {}
    for size, finished, queued in (("tiny", 0, TINY),
                                   ("backlog", plan.finished_rows, plan.backlog_rows)):
        log(f"  filling {size}: {finished:,} finished + {queued:,} queued")
        darkroom_fill(url, finished, queued)
        for what, once in cases:
            ms[(what, size)] = _timed_claims(url, plan.claims, once)
            log(f"  {what} {size}: {ms[(what, size)]:.3f} ms")
    return [FairClaim(claim=what, ms_10_rows=ms[(what, "tiny")],
                      ms_backlog=ms[(what, "backlog")], tiny_rows=TINY,
                      finished_rows=plan.finished_rows, backlog_rows=plan.backlog_rows,
                      owners_waiting=OWNERS) for what, _ in cases]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--database-url", help="a superuser URL of a PostgreSQL to use")
    parser.add_argument("--no-claims", action="store_true", help="skip the claim-time part")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    with contextlib.ExitStack() as stack:
        if args.database_url:
            server = Server(args.database_url)
        else:
            from darkroom.db import embedded

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dr-fair-")))
            server = Server(embedded.url(tmp / "pg", stop_on_exit=True))
        url = server.fresh_db("bench_fair")
        migrate(url)
        started = time.time()
        result = FairResult(
            machine=machine(), postgres=server.describe(), plan=asdict(plan), slots=SLOTS,
            command=command("fair"))
        for rep in range(plan.repeats):
            for policy in POLICIES:
                r = asyncio.run(one_run(url, policy, plan))
                log(f"  {rep} {policy:9} B p95 {(r.b_wait_p95_s or 0) * 1000:7.0f} ms  "
                    f"A {r.a_jobs_per_s:.1f} jobs/s  job {r.mean_job_s * 1000:.1f} ms")
                result.runs.append(r)
        result.summary = summarize(result.runs)
        result.confirm_rate = confirm_rates(url, plan)
        # Saved before the claim part, which takes the longest: what was measured stays.
        save(result, args.out)
        result.claim_time = [] if args.no_claims else claim_times(url, plan)
        result.elapsed_s = time.time() - started
        result.loadavg_at_end = list(os.getloadavg())
    publish("fair", result, args.out)
    print(f"({result.elapsed_s:.0f} s)")


if __name__ == "__main__":
    main()
