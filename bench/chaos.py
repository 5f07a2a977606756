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
    """Writes the run's block (`<!-- chaos:start -->` to `<!-- chaos:end -->`) into `path`;
    everything else there (the hand-written sections, the other benches' blocks) is kept."""
    t = outcome.tally
    lines = [
        f"`.venv/bin/python -m bench.chaos --files {outcome.files} --seed {seed}` on "
        f"{os.cpu_count()} cores; lease {LEASE:g} s, max attempts {MAX_ATTEMPTS}, "
        f"retry base {RETRY_BASE:g} s, sweeper guard {GUARD:g} s; API, 4 workers "
        "(one slot each) and the sweeper as separate processes; PostgreSQL 16 (pgserver); "
        "SeaweedFS as the S3 store, its volume server a process of its own.",
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
        "published derivatives: no byte of a deleted file, no orphan. A late write (an",
        "unpublished attempt's object that SeaweedFS's gateway held while its volume server",
        "was down and landed after the sweeper's short guard here) must be removed by",
        "`darkroom reconcile`; with the default guard (300 s) the sweeper takes it.",
    ]
    if outcome.problems:
        lines += ["", "Problems:", "", *[f"- {p}" for p in outcome.problems[:50]]]
    start, end = "<!-- chaos:start -->", "<!-- chaos:end -->"
    block = "\n".join([start, *lines, end])
    old = path.read_text() if path.exists() else "# Reliability: the chaos run\n\n"
    if start in old and end in old:
        text = old[:old.index(start)] + block + old[old.index(end) + len(end):]
    else:
        text = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


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
