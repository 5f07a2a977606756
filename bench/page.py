"""The page with a real archive, and what pushing status costs the queue (issue 14).

    .venv/bin/python -m bench.page [--rounds 5] [--jobs 2000]

1. The page, in Debian's headless Chromium, against a real API on a private PostgreSQL
   (pgserver) and the local store, with 2,000 cards of one owner made through the lease
   protocol (tests/api/test_page_archive.py's archive). Each round is a fresh browser
   context: first contentful paint, the time until every ready card near the viewport
   shows its thumb, the requests and the bytes of that first screen.
2. What the status notifications cost the queue: the same drain (claim 100 →
   complete_many, as bench/queue.py's) with `darkroom_notify_cards` (migration 0009) as
   shipped and replaced by a no-op, interleaved round by round in one database, with one
   connection LISTENing as an API process would. The figure is the same-run ratio of the
   drain's wall time (best of rounds). The no-op still receives the statement's changed
   cards as JSON, so this is the notification's cost, not that of building its list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import machine
from bench.results import PageDrain, PageResult, PageRound
from bench.runs import command
from bench.sections import publish
from bench.sql import SQL, composed
from darkroom.api.events import CHANNEL
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.queue import Derived, Queue, derived_key
from tests.api.conftest import start_api
from tests.support.archive import CARDS, FIRST_SCREEN_DONE, fill
from tests.support.browser import CHROMIUM_ARGS, chromium_binary
from tests.support.postgres import TestPostgres

ROOT = Path(__file__).resolve().parents[1]


def page_rounds(url: str, key: str, rounds: int) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    binary = chromium_binary()
    if binary is None:
        raise SystemExit("no Chromium (apt-get install chromium)")
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=CHROMIUM_ARGS)
        try:
            for _ in range(rounds):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.add_init_script(
                    f"localStorage.setItem('darkroom.apiKey', {json.dumps(key)})")
                page = context.new_page()
                responses: list[Any] = []
                def finished(request: Any, into: list[Any] = responses) -> None:
                    into.append(request)

                page.on("requestfinished", finished)
                page.goto(url)
                page.wait_for_function(FIRST_SCREEN_DONE, timeout=60_000)
                timing = page.evaluate("""() => ({
                    fcp: (performance.getEntriesByName("first-contentful-paint")[0]
                          || {}).startTime,
                    done: performance.now(),
                    cards: document.querySelectorAll('[data-testid="card"]').length,
                })""")
                sizes = [r.sizes() for r in responses]
                thumbs = [r for r in responses if r.url.endswith("size=thumb")]
                out.append({
                    "first_contentful_paint_ms": timing["fcp"],
                    "first_screen_ms": timing["done"],
                    "cards_rendered": timing["cards"],
                    "requests": len(responses),
                    "thumb_requests": len(thumbs),
                    "bytes_received": sum(s["responseBodySize"] for s in sizes),
                })
                context.close()
        finally:
            browser.close()
    return out


_MIGRATION = (ROOT / "darkroom" / "db" / "migrations" / "0009_thumbnails.sql").read_text()
NOTIFY_FUNCTION = _MIGRATION[_MIGRATION.index("CREATE FUNCTION darkroom_notify_cards"):].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


async def drain_ratio(db_url: str, jobs: int, rounds: int) -> dict[str, Any]:
    pool = await open_pool(db_url, min_size=2, max_size=4)
    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    await listener.execute(composed("listen", channel=CHANNEL))
    queue = Queue(Database(pool), lease_seconds=600, max_attempts=3, retry_base_seconds=0,
                  retry_cap_seconds=0, worker="bench")
    best = {"on": float("inf"), "off": float("inf")}
    try:
        for _ in range(rounds):
            for mode in ("on", "off"):
                async with pool.connection() as conn:
                    await conn.execute(NOTIFY_FUNCTION if mode == "on"
                                       else SQL["silence_card_notify"])
                    await conn.execute(SQL["delete_every_card"])
                for start in range(0, jobs, 100):
                    await asyncio.gather(*(_enqueue(queue, i) for i in
                                           range(start, min(start + 100, jobs))))
                started = time.perf_counter()
                while leases := await queue.claim(100):
                    await queue.complete_many([
                        (lease, Derived(derived_key(lease), "v", "0" * 64, 1, 1, 1))
                        for lease in leases])
                best[mode] = min(best[mode], time.perf_counter() - started)
    finally:
        await listener.close()
        await pool.close()
    return {"jobs": jobs, "drain_s": best,
            "jobs_per_s": {m: jobs / s for m, s in best.items()},
            "notify_cost_share": best["on"] / best["off"] - 1.0}


async def _enqueue(queue: Queue, i: int) -> None:
    card = await queue.create_file(owner=f"o{i % 7}", filename=f"{i}.jpg",
                                   content_type="image/jpeg", size=1, file_id=uuid.uuid4())
    await queue.confirm_card(card.id, card.owner, "v1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    started_on = machine()
    postgres = TestPostgres.start(Path(tempfile.mkdtemp()))
    try:
        with postgres.database() as db_url:
            tmp = Path(tempfile.mkdtemp(prefix="darkroom-bench-page-"))
            server, api = start_api(db_url, (tmp / "objects").as_uri(), tmp, "local")
            try:
                asyncio.run(fill(api.db_url, api.store, "archive"))
                pages = page_rounds(api.url, api.make_key("archive"), args.rounds)
            finally:
                server.stop()
        with postgres.database() as db_url:
            drain = asyncio.run(drain_ratio(db_url, args.jobs, args.rounds))
    finally:
        postgres.stop()
    publish("page", PageResult(
        cards=CARDS, rounds=[PageRound(**r) for r in pages], drain=PageDrain(**drain),
        machine=started_on, loadavg_at_end=list(os.getloadavg()), command=command("page")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
