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

Beside it, in the same run, the mixed scenario (`mixed_run`): one slot; owner BIG has a
backlog, three owners (s1, s2, s3) each upload the next photo the moment their previous
one is ready, and a bulk import waits. Policies: fifo (every card in one line), previous
(the statements before migration 0012, bench/fair_previous.sql: the head is the smallest
waiting stamp, bulk only on idle slots) and sfq (start-time fair queueing with
DARKROOM_BULK_SHARE). It measures each owner's share of the claims against its ideal,
bulk's share against DARKROOM_BULK_SHARE, and the single uploaders' waits. Then claim
throughput of concurrent claimers, the previous claim against the one that moves the
fair-share heads (`claim_throughput`).

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
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.cpu import machine
from bench.queue import (
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
from bench.results import (
    FairClaim,
    FairConfirmRate,
    FairResult,
    FairRun,
    FairSummary,
    FairThroughput,
    MixedRun,
    MixedSummary,
    save,
)
from bench.runs import BY_NAME, command
from bench.sections import publish
from bench.sql import SQL
from bench.stats import percentile
from darkroom.config import load_settings
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES
from darkroom.queue import Lease, Priority, Queue, claim_params

OUT = BY_NAME["fair"].json_path
POLICIES = ("fifo", "fair", "fair_bulk")
SLOTS = 2
BULK_SHARE = load_settings().bulk_share  # DARKROOM_BULK_SHARE, default 0.1


@dataclass(frozen=True)
class Plan:
    a_jobs: int  # A's backlog
    job_seconds: float  # one job's work
    b_interval: float  # B uploads one card this often while A's backlog drains
    repeats: int  # of each policy, interleaved
    finished_rows: int  # claim time: finished rows ...
    backlog_rows: int  # ... and queued rows of 1,000 owners
    claims: int
    # The mixed scenario: BIG's backlog, the bulk import, how long each run lasts, one job.
    mixed_big: int
    mixed_bulk: int
    mixed_seconds: float
    mixed_job_seconds: float
    # Claim throughput: concurrent claims counted, on this many queued cards.
    throughput_claims: int
    throughput_rows: int
    quick: bool = False


# B's uploads are a trickle (about 3% of the slots), as one user's photos during someone
# else's import: A's throughput can then stay near FIFO's, where B's few jobs all ran
# after A's backlog. Jobs of 100 ms keep this shared machine's scheduling hiccups small
# against the job length that the latency target is measured in.
# The mixed scenario's backlogs outlast a run under every policy, so every owner has work
# due throughout and the ideal shares apply.
FULL = Plan(a_jobs=500, job_seconds=0.1, b_interval=1.5, repeats=3,
            finished_rows=1_000_000, backlog_rows=200_000, claims=300,
            mixed_big=200, mixed_bulk=150, mixed_seconds=30.0, mixed_job_seconds=0.1,
            throughput_claims=4_000, throughput_rows=20_000)
QUICK = Plan(a_jobs=80, job_seconds=0.02, b_interval=0.25, repeats=1,
             finished_rows=20_000, backlog_rows=5_000, claims=30,
             mixed_big=60, mixed_bulk=40, mixed_seconds=4.0, mixed_job_seconds=0.02,
             throughput_claims=400, throughput_rows=2_000, quick=True)


async def _upload(q: Queue, owner: str, name: str, priority: Priority) -> uuid.UUID:
    card = await q.create_file(owner=owner, filename=name, content_type="image/jpeg", size=1,
                               priority=priority)
    await q.confirm_card(card.id, owner, "v1")
    return card.id


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
        conn.execute(SQL["empty_queue"])
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
                row = conn.execute(SQL["queued_count_among"], {"ids": a_ids}).fetchone()
            if row is None or row[0] < plan.a_jobs // 5:
                break
            b_ids.append(await _upload(api, b_owner, f"b{len(b_ids)}", Priority.INTERACTIVE))
            await asyncio.sleep(plan.b_interval)
        while True:  # drain
            with psycopg.connect(url) as conn:
                row = conn.execute(SQL["unready_count"]).fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*slots)
    finally:
        await pool.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(SQL["claimed_and_ready"]).fetchall()
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
        conn.execute(SQL["empty_queue"])
    pool = await open_pool(url, min_size=CONFIRM_CLIENTS, max_size=CONFIRM_CLIENTS,
                           name="bench-confirm")
    try:
        q = _queue(pool, "bench-confirm")
        cards = [await q.create_file(owner=f"o{i % owners}", filename="c", size=1,
                                     content_type="image/jpeg") for i in range(n)]
        todo = iter(cards)

        async def client() -> None:
            for card in todo:
                await q.confirm_card(card.id, card.owner, "v1")

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


MIXED_POLICIES = ("fifo", "previous", "sfq")
SINGLES = ("s1", "s2", "s3")
BULK_OWNER = "import"


class Rule:
    """How one policy of the mixed scenario confirms and claims, on the real statements."""

    def __init__(self, policy: str, pool: Any, queue: Queue) -> None:
        self.policy, self.pool, self.queue = policy, pool, queue

    async def _rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(sql, params)
            rows: list[dict[str, Any]] = await cur.fetchall()
            return rows

    async def upload(self, owner: str, name: str, priority: Priority) -> uuid.UUID:
        if self.policy == "fifo":  # one owner, one class: first in, first out
            owner, priority = "fifo", Priority.INTERACTIVE
        card = await self.queue.create_file(owner=owner, filename=name, size=1,
                                            content_type="image/jpeg", priority=priority)
        if self.policy == "previous":
            await self._rows(SQL["previous_confirm"], {
                "id": card.id, "owner": owner, "version": "v1", "sha256": None,
                "size": None})
        else:
            await self.queue.confirm_card(card.id, owner, "v1")
        return card.id

    async def claim(self) -> list[Lease]:
        if self.policy != "previous":
            return await self.queue.claim(1)
        rows = await self._rows(SQL["previous_claim"], {
            "n": 1, "max_attempts": 3, "claim": uuid.uuid4(), "lease_seconds": 300.0,
            "worker": "mixed"})
        return [Lease(**r) for r in rows]


async def mixed_run(url: str, policy: str, plan: Plan, bulk_share: float) -> MixedRun:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["empty_queue"])
    pool = await open_pool(url, min_size=3, max_size=3, name="bench-mixed")
    owner_of: dict[uuid.UUID, str] = {}
    claimed: list[str] = []
    try:
        queue = Queue(Database(pool), lease_seconds=300, max_attempts=3,
                      retry_base_seconds=1, retry_cap_seconds=1, worker="mixed",
                      bulk_share=bulk_share)
        rule = Rule(policy, pool, queue)
        for i in range(plan.mixed_big):
            owner_of[await rule.upload("big", f"big{i}", Priority.INTERACTIVE)] = "big"
        for i in range(plan.mixed_bulk):
            owner_of[await rule.upload(BULK_OWNER, f"imp{i}", Priority.BULK)] = BULK_OWNER
        for owner in SINGLES:
            owner_of[await rule.upload(owner, f"{owner}-0", Priority.INTERACTIVE)] = owner
        uploads: list[asyncio.Task[None]] = []

        async def next_photo(owner: str, name: str) -> None:
            owner_of[await rule.upload(owner, name, Priority.INTERACTIVE)] = owner

        started = time.monotonic()
        while time.monotonic() - started < plan.mixed_seconds:  # one slot
            leases = await rule.claim()
            if not leases:
                await asyncio.sleep(0.002)
                continue
            lease = leases[0]
            await asyncio.sleep(plan.mixed_job_seconds)  # the work
            await queue.complete(lease, noop_result(lease))
            owner = owner_of[lease.file_id]
            claimed.append(owner)
            if owner in SINGLES:  # the next photo, the moment the previous one is ready,
                # by the owner's own client: the slot goes on claiming meanwhile
                uploads.append(asyncio.create_task(
                    next_photo(owner, f"{owner}-{claimed.count(owner)}")))
        seconds = time.monotonic() - started
        await asyncio.gather(*uploads)
    finally:
        await pool.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(SQL["claimed_and_maybe_ready"]).fetchall()
    waits = sorted((claim - available).total_seconds() for fid, available, claim, _ in rows
                   if owner_of.get(fid) in SINGLES)
    jobs = [(r[3] - r[2]).total_seconds() for r in rows if r[3] is not None]
    return MixedRun(policy=policy, seconds=seconds, claims=len(claimed),
                    by_owner={o: claimed.count(o) for o in ("big", *SINGLES, BULK_OWNER)},
                    bulk_claims=claimed.count(BULK_OWNER),
                    claim_interval_s=seconds / max(len(claimed), 1),
                    mean_job_s=statistics.fmean(jobs) if jobs else 0.0, single_wait_s=waits)


def mixed_ideal(bulk_share: float) -> dict[str, float]:
    """Each owner's share while all have work due: bulk its share, the interactive
    owners the rest in equal parts (equal weights)."""
    interactive = ("big", *SINGLES)
    return {o: (1 - bulk_share) / len(interactive) for o in interactive} | {
        BULK_OWNER: bulk_share}


def summarize_mixed(runs: list[MixedRun], bulk_share: float) -> dict[str, MixedSummary]:
    out = {}
    for policy in MIXED_POLICIES:
        mine = [r for r in runs if r.policy == policy]
        if not mine:
            continue
        total = sum(r.claims for r in mine)
        waits = sorted(w for r in mine for w in r.single_wait_s)
        owners = mine[0].by_owner
        out[policy] = MixedSummary(
            claims=total,
            share={o: sum(r.by_owner[o] for r in mine) / total for o in owners},
            ideal=mixed_ideal(bulk_share),
            bulk_share=sum(r.bulk_claims for r in mine) / total,
            single_wait_p50_s=_pct(waits, 0.5), single_wait_p95_s=_pct(waits, 0.95),
            single_wait_max_s=_pct(waits, 1.0),
            mean_job_s=statistics.fmean(r.mean_job_s for r in mine),
            claim_interval_s=statistics.fmean(r.claim_interval_s for r in mine))
    return out


THROUGHPUT_CLIENTS = 8


async def _claim_rate(url: str, sql: str, claims: int, bulk_share: float) -> float:
    """Claims per second of THROUGHPUT_CLIENTS connections claiming one card at a time
    (each claim its own transaction) until `claims` were made."""
    # The previous claim takes what it knows of these (psycopg passes only its own).
    params = claim_params(n=1, max_attempts=3, lease_seconds=300.0, worker="bench",
                          claim=uuid.uuid4(), bulk_share=bulk_share)
    left = [claims]
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True)
             for _ in range(THROUGHPUT_CLIENTS)]

    async def client(conn: psycopg.AsyncConnection[Any]) -> None:
        while left[0] > 0:
            left[0] -= 1
            cur = await conn.execute(sql, params | {"claim": uuid.uuid4()}, prepare=True)
            if not await cur.fetchall():
                raise RuntimeError("claim found nothing to claim")

    try:
        t = time.perf_counter()
        await asyncio.gather(*(client(c) for c in conns))
        return claims / (time.perf_counter() - t)
    finally:
        for c in conns:
            await c.close()


def claim_throughput(url: str, plan: Plan, bulk_share: float) -> list[FairThroughput]:
    """The claim with its clock row against the previous claim, interleaved, each on a
    fresh backlog of 1,000 owners (one card in ten bulk, so bulk's share is in play)."""
    out = []
    for rep in range(max(plan.repeats, 2)):
        for name, sql in (("previous", SQL["previous_claim"]), ("sfq", QUERIES["claim"])):
            darkroom_fill(url, 0, plan.throughput_rows)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(SQL["clear_bulk_credit"])
            rate = asyncio.run(_claim_rate(url, sql, plan.throughput_claims, bulk_share))
            log(f"  claims, {THROUGHPUT_CLIENTS} clients, {name}: {rate:,.0f}/s")
            out.append(FairThroughput(claim=name, clients=THROUGHPUT_CLIENTS, rep=rep,
                                      per_s=rate))
    return out


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
            # Stopped before its directory goes (the block's exits run last to first): the
            # stop at exit would find no cluster left to stop, and the server would run on.
            stack.callback(embedded.remove, tmp / "pg")
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
        result.bulk_share = BULK_SHARE
        for rep in range(plan.repeats):  # interleaved
            for policy in MIXED_POLICIES:
                m = asyncio.run(mixed_run(url, policy, plan, BULK_SHARE))
                log(f"  {rep} mixed {policy:8} {m.claims} claims {m.by_owner}")
                result.mixed.append(m)
        result.mixed_summary = summarize_mixed(result.mixed, BULK_SHARE)
        result.throughput = claim_throughput(url, plan, BULK_SHARE)
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
