"""The whole system under fire: nothing stuck, lost, or published twice.

    .venv/bin/python -m bench.chaos [--files 2000] [--seed 7] [--report docs/RELIABILITY.md]

Starts the real pieces as separate processes — PostgreSQL (the pgserver one, so it can be
restarted), SeaweedFS as the S3 store, the API, 4 workers and the sweeper — and uploads
files through the HTTP API (presigned PUT to S3, then confirm): corpus photos and, mixed
in, hostile inputs. While they are processed, a seeded schedule kills a worker with
SIGKILL every few seconds and starts a replacement, freezes one worker past its lease and
thaws it, restarts PostgreSQL once, freezes the S3 server for longer than a retry delay,
deletes some files while they are processed, and confirms some files twice. The workers
reach PostgreSQL and S3 through fault proxies (tests/support/faults.py): throughout the
run a share of their statements is cut before it reaches the server or after the server
answered (committed, answer lost); once the store stalls for them, and once it refuses
them for longer than the whole retry schedule. Once its volume server (the bytes) is
killed for everyone while its S3 front answers, and then started again.

At the end everything is checked from the database and the store, not from logs. The
test suite runs this in a reduced size (tests/chaos/test_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from tests.support.chaos import (
    GUARD,
    LEASE,
    MAX_ATTEMPTS,
    PARTIAL_OUTAGE_SECONDS,
    RETRY_BASE,
    STORE_OUTAGE_SECONDS,
    Outcome,
    run,
)


def report(outcome: Outcome, seed: int, path: Path) -> None:
    t = outcome.tally
    lines = [
        "# Reliability: the chaos run",
        "",
        f"`.venv/bin/python -m bench.chaos --files {outcome.files} --seed {seed}` on "
        f"{os.cpu_count()} cores; lease {LEASE:g} s, max attempts {MAX_ATTEMPTS}, "
        f"retry base {RETRY_BASE:g} s, sweeper guard {GUARD:g} s; API, 4 workers "
        "(one slot each) and the sweeper as separate processes; PostgreSQL 16 (pgserver); "
        "SeaweedFS as the S3 store.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| files uploaded and confirmed | {outcome.files} (hostile: {outcome.hostile}) |",
        f"| deleted while in flight | {outcome.deleted} |",
        f"| confirmed twice | {t.double_confirms} |",
        f"| workers killed with SIGKILL | {t.kills} |",
        f"| workers frozen past their lease | {t.freezes} |",
        f"| PostgreSQL restarts | {t.pg_restarts} |",
        f"| S3 server freezes | {t.s3_freezes} |",
        f"| statements cut before reaching PostgreSQL | {t.cuts_before} |",
        f"| statements committed, answer cut | {t.cuts_after} |",
        f"| S3 stalls for the workers | {t.s3_stalls} |",
        f"| S3 outages for the workers ({STORE_OUTAGE_SECONDS:g} s, refused) | {t.s3_outages} |",
        f"| partial S3 outages: volume server down, front answering"
        f" ({PARTIAL_OUTAGE_SECONDS:g} s, everyone) | {t.s3_partial_outages} |",
        f"| cards handed back for the store, attempt not counted | {outcome.deferred} |",
        f"| attempts started (claims) | {outcome.claims} (max per file: {outcome.max_starts}) |",
        f"| lease_lost events | {outcome.lease_lost} |",
        f"| retries scheduled, by cause | {outcome.retries or 'none'} |",
        f"| orphans swept | {outcome.orphans_swept} |",
        f"| late writes: landed past the {GUARD:g} s guard, removed by reconcile"
        f" | {outcome.late_writes} |",
        f"| final statuses | {outcome.statuses} |",
        f"| time to drain after the last fault | {outcome.drain_seconds:.1f} s |",
        f"| whole run | {outcome.total_seconds:.0f} s |",
        f"| problems found | {len(outcome.problems)} |",
        "",
        "Checked from the database and the bucket at the end: every confirmed file is",
        "`ready` (photos) or `rejected` with its expected code (hostile inputs), none is",
        "`queued` or `processing`; every `ready` card was published exactly once, by the",
        "attempt holding the last lease, and its derivative exists at the recorded version",
        "with the recorded sha256; no file was started more than `MAX_ATTEMPTS` times; and",
        "after the guard interval the bucket holds exactly the live originals and the",
        "published derivatives: no byte of a deleted file, no orphan.",
    ]
    lines += [
        "",
        "## Faults at the network, one at a time",
        "",
        "`tests/worker/test_faults.py` (in `make test`) runs 200 files through a worker",
        "process behind a fault proxy (`tests/support/faults.py`) for each fault alone, the",
        "API and the sweeper connected normally, and checks the same from the database, the",
        "bucket and `GET /v1/files/{id}/derivative` (200, the card's sha256):",
        "",
        "| fault | what must hold |",
        "| --- | --- |",
        "| 8 % of the worker's statements cut before they reach PostgreSQL | all 200 ready, "
        "each started exactly once (no attempt spent), no `lease_lost`, nothing for "
        "reconciliation |",
        "| 8 % of the worker's statements committed, answer cut | the same: every repeat "
        "is recognized, no published derivative is orphaned or swept |",
        "| the store stalls, resets or refuses the worker, past the whole retry schedule "
        "| no file rejected; the worker pauses (`worker_pauses`, its log) and resumes by "
        "itself; all 200 ready |",
        "| a decode hangs past `DARKROOM_ATTEMPT_TIMEOUT_SECONDS` | the card is queued again "
        "(`processing_timeout`), then rejected after its attempts |",
        "| SIGTERM while PostgreSQL is unreachable | the worker still exits 0 (its leases "
        "expire) |",
    ]
    if outcome.problems:
        lines += ["", "## Problems", "", *[f"- {p}" for p in outcome.problems[:50]]]
    # The multi-host rehearsal's (bench/hosts.py) and the failover's (bench/failover.py)
    # sections live in the same file: kept.
    old = path.read_text() if path.exists() else ""
    for name in ("hosts", "failover"):
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start in old and end in old:
            lines += ["", old[old.index(start):old.index(end) + len(end)]]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="darkroom-chaos-") as tmp:
        outcome = run(args.files, args.seed, Path(tmp))
    print(json.dumps(outcome.as_dict(), indent=2, default=str))
    if args.report:
        report(outcome, args.seed, args.report)
    raise SystemExit(1 if outcome.problems else 0)


if __name__ == "__main__":
    main()
