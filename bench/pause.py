"""What an operator's pause costs the claim: claim(1) and claim(32) against a backlog of
1,000 owners' due cards (bench.queue's claim-time table) with no pause, with one owner
paused, and with every card paused (`darkroom pause`).

The paused owner's due cards stay at the head of the claim's index order, interleaved
with everyone's (stamps are per owner line); the claim steps over them. `--ahead N` also
measures the case the design names as its cost: the paused owner has N due cards *ahead*
of every other owner's (the others went on being served during a long pause).

    .venv/bin/python -m bench.pause [--backlog N] [--ahead N] [--claims N] [--database-url URL]

Prints the median ms per claim (each in a rolled-back transaction, bench.queue
`_timed_claims`). Not part of `make bench`'s report: a check of one design decision.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from bench.queue import Server, _timed_claims, darkroom_claim_once, darkroom_fill, log
from bench.sql import SQL
from darkroom.db.migrations import migrate
from darkroom.db.queries import QUERIES
from darkroom.layout import ORIGINALS
from darkroom.queue import claim_params
from tests.support.sql import SQL as TEST_SQL


def _pause(url: str, owner: str | None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TEST_SQL["clear_claim_pauses"])
        if owner != "none":
            conn.execute(SQL["add_bench_pause"], {"owner": owner})


def _ahead(url: str, owner: str, n: int) -> None:
    """`n` due cards of `owner` stamped ahead of every waiting card."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["fill_ahead"], {"owner": owner, "originals": ORIGINALS, "n": n})
        conn.execute(SQL["vacuum_analyze_cards"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--ahead", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--database-url", help="a superuser URL of a PostgreSQL to use")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.database_url:
            server = Server(args.database_url)
        else:
            from darkroom.db import embedded

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dr-pause-")))
            # Stopped before its directory goes (the block's exits run last to first): the
            # stop at exit would find no cluster left to stop, and the server would run on.
            stack.callback(embedded.remove, tmp / "pg")
            server = Server(embedded.url(tmp / "pg", stop_on_exit=True))
        url = server.fresh_db("bench_pause")
        migrate(url)
        log(f"filling {args.backlog:,} due cards of 1,000 owners")
        darkroom_fill(url, 0, args.backlog)
        rows = []
        # Owner u1's cards are interleaved with everyone's (bench.queue's fair fill).
        cases: list[tuple[str, str | None]] = [
            ("no pause", "none"), ("owner u1 paused", "u1")]
        for label, owner in cases:
            _pause(url, owner)
            for n in (1, 32):
                rows.append((label, n, _timed_claims(url, args.claims, darkroom_claim_once(n))))
        # Every card paused: the claim answers nothing, so it is timed directly.
        _pause(url, None)
        with psycopg.connect(url, autocommit=True) as conn:
            times = []
            for i in range(args.claims + 10):
                t = time.perf_counter()
                got = conn.execute(QUERIES["claim"], claim_params(
                    n=32, max_attempts=3, lease_seconds=300.0, worker="bench",
                    claim=uuid.uuid4(), bulk_share=0.1), prepare=True).fetchall()
                if i >= 10:
                    times.append((time.perf_counter() - t) * 1000)
                assert not got
            rows.append(("every card paused", 32, statistics.median(times)))
        if args.ahead:
            _ahead(url, "u1", args.ahead)
            _pause(url, "u1")
            for n in (1, 32):
                rows.append((f"owner u1 paused, {args.ahead:,} of its cards ahead", n,
                             _timed_claims(url, args.claims, darkroom_claim_once(n))))
        print(f"| case ({args.backlog:,} due cards, 1,000 owners) | claim | median ms |")
        print("| --- | --- | --- |")
        for label, n, ms in rows:
            print(f"| {label} | claim({n}) | {ms:.3f} |")


if __name__ == "__main__":
    main()
