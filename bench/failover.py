"""The database fails over: what a promoted standby loses, synchronous against asynchronous.

    .venv/bin/python -m bench.failover [--files 500] [--mode sync async] [--report]

For each mode, a primary and a streaming standby are made from the embedded PostgreSQL's
own binaries (`initdb`, `pg_basebackup -R`; tests/support/replica.py), the API, 3 workers
and the sweeper start as processes given both hosts with `target_session_attrs=read-write`,
and `--files` small photos are created, uploaded and confirmed through the HTTP API. Once
40 % are confirmed the primary is killed (`kill -9`, every backend with it) and the
standby promoted a second later (`pg_ctl promote`); nothing is restarted. At the end the
figures come from the new primary and the store (tests/support/failover.py):

- what the promoted standby lacked: confirms answered 202, cards answered 201, derivatives
  published (seen `ready` on the old primary);
- how they came back: pending cards whose upload is stored, confirmed by the sweeper
  (`upload_found`); originals no card held, given one by `darkroom reconcile --restore`;
- that every stored original is still there, and every upload ended `ready`.

The JSON goes to bench/out/failover.json; `--report` splices the table into
docs/BENCHMARKS.md (between its `report:failover` markers, bench/splice.py) and
docs/RELIABILITY.md (between `failover:start` and `failover:end`). The test suite runs
the synchronous mode reduced (tests/chaos/test_failover.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu import cpu_model
from bench.splice import DOC, block, splice
from tests.support.failover import (
    KILL_AT,
    LAG,
    LEASE,
    PENDING_TTL,
    PROMOTE_AFTER,
    Outcome,
    run,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "failover.json"
RELIABILITY = ROOT / "docs" / "RELIABILITY.md"


def table(results: list[dict[str, Any]]) -> list[str]:
    def row(label: str, key: str) -> str:
        return f"| {label} | " + " | ".join(str(r.get(key, "—")) for r in results) + " |"

    modes = ["synchronous" if r["synchronous"] else "asynchronous" for r in results]
    return [
        "| figure | " + " | ".join(modes) + " |",
        "| --- |" + " --- |" * len(results),
        row("files created, uploaded and confirmed", "files"),
        row("uploads stored (PUT answered 200)", "stored"),
        row("confirms answered 202", "acked"),
        row("primary killed after (s)", "kill_after_seconds"),
        row("first card moved again, after the kill (s)", "reconnect_seconds"),
        row("open event stream: resync, then status events from the new primary",
            "stream_events_after_kill"),
        row("cards seen ready on the old primary", "ready_before_kill"),
        row("**acknowledged confirms lost** (pending again, or no card, on the new primary)",
            "lost_acked_confirms"),
        row("**acknowledged creates lost** (no card on the new primary)", "lost_creates"),
        row("**published derivatives lost** (not ready on the new primary)",
            "lost_published"),
        row("confirmed by the sweeper, upload found (`upload_found`)", "upload_found"),
        row("given a card by `darkroom reconcile --restore`", "restored"),
        row("stored originals deleted", "originals_deleted"),
        row("most starts of one file", "max_starts"),
        row("whole run (s)", "total_seconds"),
        "| problems found | " + " | ".join(str(len(r["problems"])) for r in results) + " |",
    ]


def render(data: dict[str, Any]) -> list[str]:
    results = data["results"]
    return [
        "",
        "Command:",
        "",
        f"    .venv/bin/python -m bench.failover --files {results[0]['files']} --report",
        "",
        f"Machine: {data['nproc']} CPUs ({data['cpu']}), {data['date']}; PostgreSQL 16 "
        f"(pgserver's binaries), primary and streaming standby on one machine; API, 3 "
        f"workers (2 slots each) and the sweeper as processes; local object store; lease "
        f"{LEASE:g} s, pending TTL {PENDING_TTL:g} s; once {KILL_AT:.0%} of the files "
        f"were confirmed the replication link stalled {LAG:g} s, then the primary was "
        f"killed (`kill -9`) and the standby promoted {PROMOTE_AFTER:g} s later.",
        "",
        *table(results),
        "",
    ]


def reliability(lines: list[str]) -> list[str]:
    """The section of docs/RELIABILITY.md: the table with what it shows."""
    return [
        "## Database failover (bench/failover.py)",
        "",
        "A primary and a streaming standby (tests/support/replica.py), darkroom under load"
        " given both hosts with `target_session_attrs=read-write`. Shortly before the kill"
        " the replication link stalls for 2 s, as a congested or partitioned network"
        " leaves a standby behind; then the primary is killed with `kill -9` (every"
        " backend with it) and the standby promoted. No darkroom process is restarted.",
        *lines,
        "What must hold, checked from the new primary and the store: with synchronous"
        " replication nothing acknowledged is lost (every confirm answered 202 ends"
        " `ready` with a readable derivative whose sha256 is the card's), no file is"
        " started more than its maximum, nothing is left for reconciliation; with"
        " asynchronous replication the loss is the figures in bold, and still no stored"
        " original is deleted: lost confirms come back through the pending sweep"
        " (`upload_found`), lost cards through `darkroom reconcile --restore`, lost"
        " derivatives are made again, and every upload ends `ready`. The reduced"
        " synchronous run is `tests/chaos/test_failover.py` (150 files, slow lane).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--mode", nargs="+", default=["sync", "async"],
                        choices=["sync", "async"])
    parser.add_argument("--report", action="store_true",
                        help="write docs/BENCHMARKS.md and docs/RELIABILITY.md")
    parser.add_argument("--from-json", action="store_true", help="rerun nothing")
    args = parser.parse_args()
    if args.from_json:
        data = json.loads(OUT.read_text())
    else:
        results: list[Outcome] = []
        for mode in args.mode:
            with tempfile.TemporaryDirectory(prefix="darkroom-failover-run-") as tmp:
                results.append(run(args.files, synchronous=mode == "sync", tmp=Path(tmp)))
            print(json.dumps(results[-1].as_dict(), indent=2, default=str), flush=True)
        data = {"nproc": os.cpu_count(), "cpu": cpu_model(),
                "date": time.strftime("%Y-%m-%d"),
                "results": [r.as_dict() for r in results]}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(data, indent=2, default=str))
    lines = render(data)
    print("\n".join(lines))
    if args.report:
        DOC.write_text(splice(DOC.read_text(), "failover",
                              "Database failover (bench/failover.py)",
                              block("failover", lines)))
        doc = RELIABILITY.read_text()
        start, end = "<!-- failover:start -->", "<!-- failover:end -->"
        body = "\n".join([start, *reliability(lines), end])
        if start in doc and end in doc:
            doc = doc[:doc.index(start)] + body + doc[doc.index(end) + len(end):]
        else:
            doc = doc.rstrip("\n") + "\n\n" + body + "\n"
        RELIABILITY.write_text(doc)
    raise SystemExit(1 if any(r["problems"] for r in data["results"]) else 0)


if __name__ == "__main__":
    main()
