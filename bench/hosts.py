"""darkroom on seven hosts, with real partitions between them.

    sudo .venv/bin/python -m bench.hosts [--files 2000] [--seed 5] [--report docs/RELIABILITY.md]

Each host is a network namespace with its own stack and address on one bridge:

    db     10.216.16.2   PostgreSQL (pgserver's binaries), listening on its address
    store  10.216.16.3   SeaweedFS S3, with an identity (signed requests)
    api    10.216.16.4   darkroom api
    w1–w3  10.216.16.11– darkroom worker, one slot each
    sweep  10.216.16.20  darkroom sweep
    (the bridge itself, 10.216.16.1, is the client uploading through the API)

While the files go through the API (presigned PUT to the store, then confirm), the faults
are real network faults, not signals:
- w1's link goes down for longer than the lease while it holds leases, then comes back:
  its cards are taken over and finished by the others, and nothing it finishes late is
  published (a late write is fenced and recorded as lease_lost);
- the store becomes unreachable from w2 only (w2's frames to it go to a MAC nobody has,
  so they vanish silently, as in a real partition; everyone else still reaches it);
- the database becomes unreachable from the API the same way: /readyz must answer 503
  within its timeout, no request may hang, and 202s must come back by themselves;
- every process of w3 is killed at once (a host crash), and the host comes back later.

At the end everything is checked from the database and the bucket exactly as the chaos
run checks it (bench/chaos.py `verify`): 0 lost, 0 stuck, 0 stale publications, attempts
within the maximum, no untracked bytes after the final sweep. Needs root (namespaces);
`tc netem` is not used (this kernel lacks it). Only addresses of these namespaces are
ever contacted. The test suite runs a reduced size (tests/chaos/test_hosts.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from tests.support.chaos import MAX_ATTEMPTS
from tests.support.hosts import (
    LEASE,
    HostsOutcome,
    Network,
    run,
)


def plot(result: HostsOutcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    fig, ax = plt.subplots(figsize=(12.4, 4.8), dpi=100)
    t = [s[0] for s in tl.samples]
    ax.plot(t, [s[1] for s in tl.samples], label="finished (ready + rejected)")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("cards")
    twin = ax.twinx()
    twin.plot(t, [s[2] for s in tl.samples], color="#dd8452", label="processing")
    twin.plot(t, [s[3] for s in tl.samples], color="#c44", label="lease_lost events")
    twin.set_ylabel("processing / lease_lost")
    colors = ["#4c72b0", "#55a868", "#c44e52", "#8172b2"]
    for (name, a, b), color in zip(tl.spans, colors, strict=False):
        ax.axvspan(a, b, alpha=0.18, color=color, label=name)
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    fig.suptitle(f"Multi-host rehearsal: {result.outcome.files} files, 7 hosts, "
                 "real partitions", fontweight="bold")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


START, END = "<!-- hosts:start -->", "<!-- hosts:end -->"


def report(result: HostsOutcome, seed: int, path: Path, files: int) -> None:
    o, hf, t = result.outcome, result.faults, result.outcome.tally
    plot(result, path.parent / "img" / "hosts.png")
    lines = [
        START,
        "## Multi-host rehearsal (bench/hosts.py)",
        "",
        f"`sudo .venv/bin/python -m bench.hosts --files {files} --seed {seed}` on "
        f"{os.cpu_count()} cores: seven network namespaces on one bridge (db, store, api, "
        f"w1–w3 with one slot each, sweep), each with its own address; lease {LEASE:g} s, "
        f"max attempts {MAX_ATTEMPTS}. Faults are network faults: a link set down, or a "
        "host's frames to one peer sent to a MAC nobody has (silently lost, as in a "
        "partition; `tc netem` is not available on this kernel).",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| files uploaded and confirmed | {o.files} (hostile: {o.hostile}; probes "
        f"during the database cut: {o.files - files}) |",
        f"| w1 link down | {hf.link_cut_seconds:.1f} s, holding {hf.link_cut_leases_held} "
        "lease(s) |",
        f"| store unreachable from w2 only | {hf.store_cut_seconds:.1f} s |",
        f"| database unreachable from the API | {hf.db_cut_seconds:.1f} s: /readyz "
        f"{hf.readyz_during_db_cut} (slowest {hf.readyz_max_seconds:.1f} s); "
        f"{hf.api_calls_during_db_cut} upload(s) during the cut, answered {hf.probe_statuses} "
        "after "
        f"{hf.api_slowest_call_during_db_cut:.1f} s; first 202 "
        f"{(hf.accepted_202_after_db_heal_s or 0):.1f} s after the heal |",
        f"| w3 host killed | {hf.host_kill_processes} processes, back after {LEASE:g} s |",
        f"| untracked objects `darkroom reconcile` deleted at the end | "
        f"{hf.reconcile_deleted} |",
        f"| attempts started (claims) | {o.claims} (max per file: {o.max_starts}) |",
        f"| lease_lost events (late writes fenced) | {o.lease_lost} |",
        f"| retries scheduled, by cause | {o.retries or 'none'} |",
        f"| orphans swept | {o.orphans_swept} |",
        f"| final statuses | {o.statuses} |",
        f"| time to drain after the last fault | {o.drain_seconds:.1f} s |",
        f"| whole run | {o.total_seconds:.0f} s |",
        f"| problems found | {len(o.problems)} |",
        "",
        "Checked from the database and the bucket as the chaos run checks (0 lost, 0 "
        "stuck, every `ready` card published once by the attempt holding the last lease, "
        "no file started more than the maximum, after the final sweep and `darkroom "
        "reconcile` the bucket holds exactly the live originals and published "
        "derivatives, and reconcile found nothing to delete).",
        "",
        "Timeline: " + "; ".join(t.log),
        "",
        "![Multi-host rehearsal timeline](img/hosts.png)",
    ]
    if o.problems:
        lines += ["", "### Problems", "", *[f"- {p}" for p in o.problems[:50]]]
    lines.append(END)
    doc = path.read_text() if path.exists() else ""
    block = "\n".join(lines)
    if START in doc and END in doc:
        doc = doc[:doc.index(START)] + block + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    reason = Network.unavailable()
    if reason:
        raise SystemExit(f"bench.hosts: {reason}")
    with tempfile.TemporaryDirectory(prefix="darkroom-hosts-") as tmp:
        result = run(args.files, args.seed, Path(tmp))
    print(json.dumps({**result.outcome.as_dict(), "hosts": vars(result.faults)},
                     indent=2, default=str))
    if args.report:
        report(result, args.seed, args.report, args.files)
    raise SystemExit(1 if result.outcome.problems else 0)


if __name__ == "__main__":
    main()
