"""One renderer per benchmark: its Markdown tables and its targets, from its JSON.

The report splices these into docs/BENCHMARKS.md (`RENDERERS`); a benchmark's own script
writes its result and prints it through the same renderer (`publish`), so each table is
written once. The scripts outside the report (confirm_digest.py,
queue_split.py) have theirs here too.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.markdown import Target, images, num, table, table_line, targets_table
from bench.provenance import Source
from bench.results import (
    ApiResult,
    ConfirmDigestResult,
    DeriveFormatsResult,
    DeriveResult,
    EnginesResult,
    FairResult,
    PageResult,
    QueueClaim,
    QueueResult,
    QueueSplitResult,
    QueueSplitRun,
    QueueThroughput,
    SoakResult,
    WorkerResult,
    load,
    save,
)
from bench.runs import BY_NAME
from bench.targets import (
    API_P99_MS,
    DERIVE_BOMB_MS,
    DERIVE_CHILD_RSS_MB,
    DERIVE_JAIL_RATIO,
    DERIVE_OWNER_SWITCH_COST,
    DERIVE_PIPELINE_RATIO,
    DERIVE_THUMB_EXTRA,
    DERIVE_TWO_VS_ONE,
    ENGINES_QUALITY_SLACK,
    ENGINES_VS_PYVIPS,
    ENGINES_VS_SHARP,
    FAIR_A_VS_FIFO,
    FAIR_B_WAIT_JOBS,
    FAIR_CLAIM_GROWTH,
    FAIR_CLAIM_THROUGHPUT,
    FAIR_MIXED_SHARE_SLACK,
    FAIR_MIXED_WAIT_JOBS,
    QUEUE_CLAIM_GROWTH,
    QUEUE_IDLE_P50_MS,
    QUEUE_IDLE_P50_VS_PGQUEUER,
    QUEUE_VS_PGQUEUER,
    SOAK_DRIFT,
    WORKER_IDLE_P50_MS,
    WORKER_VS_PIPELINE,
)

QUEUE_LABELS = {"darkroom": "darkroom", "darkroom (batched complete)": "darkroom, batched",
                "darkroom (proposed claim fix)": "darkroom + claim fix",
                "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate", "seed": "seed"}
# The systems the throughput target judges: the worker's own completion path only (the
# batched variant is a reference for what batching would buy, not what the worker does).
TARGET_SYSTEMS = ("darkroom",)
BATCHED = "darkroom (batched complete)"


def series_of(tp: list[QueueThroughput]) -> dict[tuple[str, str], dict[int, QueueThroughput]]:
    by: dict[tuple[str, str], dict[int, QueueThroughput]] = {}
    for r in tp:
        by.setdefault((r.system, r.config), {})[r.workers] = r
    return by


def best(tp: list[QueueThroughput], w: int | None = None,
         system: str = "pgqueuer") -> QueueThroughput | None:
    """A system's best configuration (at w workers, or anywhere); PgQueuer's is the
    issue's baseline."""
    rs = [r for r in tp if r.system == system and (w is None or r.workers == w)]
    return max(rs, key=lambda r: r.median) if rs else None


def _per_worker_table(series: dict[tuple[str, str], dict[int, QueueThroughput]],
                      counts: list[int], cell: Callable[[QueueThroughput], str]) -> list[str]:
    rows = [[QUEUE_LABELS.get(system, system), config,
             *(cell(per[w]) if w in per else "–" for w in counts)]
            for (system, config), per in series.items()]
    return table(["system", "configuration", *(f"{w} worker{'s' * (w > 1)}" for w in counts)],
                 rows, right_from=2)


def queue_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(QueueResult, src.data or {})
    tp, plan = res.throughput, res.plan
    counts = sorted({r.workers for r in tp}) or list(plan.get("workers") or [])
    series = series_of(tp)
    lines: list[str] = []
    targets: list[Target] = []
    pictures: list[str] = []

    if tp:
        def jobs_per_s(r: QueueThroughput) -> str:
            runs = r.runs_jobs_per_s
            spread = f" ({min(runs):,.0f}–{max(runs):,.0f})" if len(runs) > 1 else ""
            return f"{r.median:,.0f}{spread}"

        lines += ["", "No-op throughput (claim → fenced complete), jobs/s, median of "
                  f"{plan.get('repeats', '?')} run(s) for darkroom/PgQueuer (range in "
                  "brackets), one run for the others. darkroom runs the worker's own "
                  "completion path: as many job tasks as the worker has slots, each handing "
                  "its result to the worker's `Completer`, which commits the results that "
                  "finish together in one fenced statement, over its pool of 4 "
                  "connections; \"darkroom, batched\" (claim 100, one `complete_many`) is "
                  "the most batching any path can do, measured as a reference:", ""]
        lines += _per_worker_table(series, counts, jobs_per_s)

        # The same numbers as ratios to the two same-run baselines the issue names.
        seed = {r.workers: r for r in tp if r.system == "seed"}

        def ratios(r: QueueThroughput) -> str:
            pq, sd = best(tp, r.workers), seed.get(r.workers)
            if pq is None or sd is None:
                return "–"
            return f"{r.median / pq.median:.2f}× / {r.median / sd.median:.1f}×"

        lines += ["", "Same-run ratios at each worker count: × PgQueuer's best configuration "
                  "/ × the seed's protocol:", ""]
        lines += _per_worker_table(series, counts, ratios)
        if any(r.cpu_us_per_job for r in tp):
            def cpu(r: QueueThroughput) -> str:
                steal = r.runs_steal_share
                return ("–" if not r.cpu_us_per_job else f"{r.cpu_us_per_job:.0f}"
                        + (f" (steal {max(steal):.0%})" if steal else ""))

            lines += ["", "CPU per job while the workers ran, µs: every process on the machine "
                      "(workers and PostgreSQL), median of the same runs, with the largest "
                      "share of wall time the hypervisor stole in any of them. It moves far "
                      "less between runs than jobs/s on this shared machine, and bounds "
                      "throughput once the cores are saturated:", ""]
            lines += _per_worker_table(series, counts, cpu)
        pq_best = best(tp)
        for system in TARGET_SYSTEMS:
            top = best(tp, None, system)
            if top and pq_best:
                ratio = top.median / pq_best.median
                # darkroom's best configuration at each worker count, like PgQueuer's
                per_w = ", ".join(
                    f"{r.median / pw.median:.2f}× at {w}"
                    for w in counts
                    if (r := best(tp, w, system)) and (pw := best(tp, w)))
                targets.append(Target(
                    f"{QUEUE_LABELS[system]}: no-op throughput ≥ {QUEUE_VS_PGQUEUER}× "
                    "PgQueuer's best configuration, every completion fenced",
                    f"best {top.median:,.0f} jobs/s ({top.config}, {top.workers} workers) vs "
                    f"PgQueuer best {pq_best.median:,.0f} ({pq_best.config}, "
                    f"{pq_best.workers} workers): **{ratio:.2f}×** ({per_w})",
                    ratio >= QUEUE_VS_PGQUEUER))
        batched = ", ".join(f"{r.median / own.median:.1f}× at {r.workers}"
                            for r in tp if r.system == BATCHED
                            if (own := best(tp, r.workers, "darkroom")))
        if batched:
            lines += ["", "Full batches (`claim 100`, `complete_many`) against the worker's "
                      f"own path, same run, best configuration each: {batched}."]
        pictures.append("img/queue_throughput.png")

    if res.latency:
        lines += ["", f"Idle enqueue → start latency at {plan.get('latency_rate', 50):.0f} "
                  f"jobs/s for {plan.get('latency_seconds', '?')} s per system, every system "
                  f"in this same run, taken in turn in {plan.get('latency_rounds', 1)} "
                  "round(s) (start = darkroom's claim, the peers' job function entered, the "
                  "seed's claim); ratio = the system's p50 / darkroom's:", ""]
        dr = res.latency.get("darkroom")
        rows = []
        for name, s in res.latency.items():
            if s.n and s.p50_ms is not None:
                vs_dr = f"{s.p50_ms / dr.p50_ms:.1f}×" if dr and dr.p50_ms else "–"
                rows.append([QUEUE_LABELS.get(name, name), s.wake_up or "?",
                             f"{s.n}/{s.enqueued}", num(s.p50_ms, ".1f"), num(s.p95_ms, ".1f"),
                             num(s.max_ms, ".1f"), vs_dr])
        lines += table(["system", "wake-up", "started", "p50 ms", "p95 ms", "max ms",
                        "p50 × darkroom's"], rows, right_from=2)
        if dr and dr.p50_ms is not None:
            peers = [f"{QUEUE_LABELS.get(n, n)}'s p50 is {s.p50_ms / dr.p50_ms:.1f}× darkroom's"
                     for n, s in res.latency.items()
                     if n != "darkroom" and s.p50_ms is not None]
            targets.append(Target(f"darkroom: idle latency p50 < {QUEUE_IDLE_P50_MS:.0f} ms",
                                  f"p50 {dr.p50_ms:.1f} ms, p95 {num(dr.p95_ms, '.1f')} ms"
                                  + (f"; same run: {', '.join(peers)}" if peers else ""),
                                  dr.p50_ms < QUEUE_IDLE_P50_MS))
            pq = res.latency.get("pgqueuer")
            if pq is not None and pq.p50_ms:
                ratio = dr.p50_ms / pq.p50_ms
                targets.append(Target(
                    "darkroom: idle latency p50 ≤ PgQueuer's in the same run",
                    f"{dr.p50_ms:.1f} / {pq.p50_ms:.1f} ms = **{ratio:.2f}×**",
                    ratio <= QUEUE_IDLE_P50_VS_PGQUEUER))

    claims = res.claim_time
    if claims:
        c0 = claims[0]
        lines += ["", f"Claim time, median of {plan.get('claims', '?')} claims (each rolled "
                  "back); ratio = big table / tiny table, same run:", ""]
        rows = [[QUEUE_LABELS.get(c.system, c.system), c.claim, num(c.ms_10_rows, ".2f"),
                 num(c.ms_big, ".2f"), f"{c.ms_big / c.ms_10_rows:.2f}×",
                 num(c.ms_backlog, ".2f"),
                 "–" if not c.ms_backlog else f"{c.ms_backlog / c.ms_10_rows:.2f}×"]
                for c in claims]
        lines += table(["system", "claim", f"{c0.tiny_rows} queued rows, ms",
                        f"{c0.finished_rows:,} finished + {c0.queued_rows:,} queued, ms",
                        "ratio", _backlog_label(c0) + ", ms", "ratio"],
                       rows, right_from=2)
        for c in claims:
            if c.system.startswith("darkroom"):
                ratio = c.ms_big / c.ms_10_rows
                targets.append(Target(
                    f"{QUEUE_LABELS.get(c.system, c.system)}: {c.claim} at "
                    f"{c.finished_rows:,} finished rows within {QUEUE_CLAIM_GROWTH}× of a "
                    "tiny table", f"{c.ms_big:.2f} / {c.ms_10_rows:.2f} ms = **{ratio:.2f}×**",
                    ratio <= QUEUE_CLAIM_GROWTH))
                owners = c.extra.get("owners_waiting")
                if owners and c.ms_backlog:  # issue 13: finished rows and 1,000 owners
                    b_ratio = c.ms_backlog / c.ms_10_rows
                    targets.append(Target(
                        f"{QUEUE_LABELS.get(c.system, c.system)}: {c.claim} at "
                        f"{c.finished_rows:,} finished rows, {owners:,} owners waiting and "
                        f"{c.backlog_rows:,} queued within {QUEUE_CLAIM_GROWTH}× of a tiny "
                        "table", f"{c.ms_backlog:.2f} / {c.ms_10_rows:.2f} ms = "
                        f"**{b_ratio:.2f}×**", b_ratio <= QUEUE_CLAIM_GROWTH))
        pictures.append("img/queue_claim_time.png")
    lines += images(pictures, {"queue_throughput": "Throughput against worker count",
                               "queue_claim_time": "Claim time against table size"})
    return lines, targets


DERIVE_MEASURES = (("decode_resize", "decode + resize alone (pyvips)"),
                   ("encode", "encode alone (WebP)"),
                   ("pipeline_child", "pipeline, child process (production)"),
                   ("pipeline_child_unjailed",
                    "pipeline, child without the jail"),
                   ("pipeline_in_process", "pipeline, in process"),
                   ("pillow", "Pillow, same job"),
                   ("pillow_encode", "encode alone, Pillow's libwebp"))


def derive_section(src: Source) -> tuple[list[str], list[Target]]:
    d = load(DeriveResult, src.data or {})
    ips, wall, limit = d.images_per_second_per_core, d.images_per_second_wall, d.component_limit
    lines = ["", f"Corpus: {len(d.corpus)} images, best of {d.rounds} rounds, libvips "
             f"{d.machine.get('libvips', '?')}. Rates are images per CPU-second of one core "
             "(wall-clock rate next to it); ratio = rate / component limit 1 / "
             "(t_decode+resize + t_encode), same run.", ""]
    rows = [["component limit", num(limit, ".2f"), "–", "1.00×"]]
    rows += [[label, num(ips.get(k), ".2f"), num(wall.get(k), ".2f"),
              f"{ips[k] / limit:.2f}×" if k in ips and limit else "–"]
             for k, label in DERIVE_MEASURES if k in ips]
    lines += table(["measure", "img/s per core", "img/s wall", "× component limit"], rows)
    per_image = d.child_cpu_seconds_per_image
    lines += ["", table_line("pyvips pipeline against Pillow doing the same job",
                             f"{d.pyvips_vs_pillow:.2f}×"),
              table_line("two decoder processes vs one (wall)",
                         f"{d.two_processes_ips:.2f} vs {d.one_process_ips:.2f} img/s; "
                         f"child CPU per image {num(per_image.get('two', 0) * 1000, '.0f')} "
                         f"vs {num(per_image.get('one', 0) * 1000, '.0f')} ms"),
              table_line("child peak RSS, 17.9 MP JPEG",
                         f"{d.child_peak_rss_mb:.0f} MB (Pillow doing the same job: "
                         f"{d.pillow_peak_rss_mb:.0f} MB; image: {d.big_image})"),
              table_line("reject a 30,000² zlib bomb",
                         f"{d.bomb_rejection_ms:.2f} ms (100,000² PNG header: "
                         f"{d.header_100k_rejection_ms:.2f} ms)")]
    if d.jail:
        up, cpu = d.jail.start_up_ms, d.jail.cpu_per_image_ms
        lines += [table_line("decoder jail, child start-up to first answer (median)",
                             f"{num(up.get('jailed_median'), '.0f')} ms jailed vs "
                             f"{num(up.get('unjailed_median'), '.0f')} ms without, wall; "
                             f"child CPU {num(up.get('jailed_cpu_median'), '.0f')} vs "
                             f"{num(up.get('unjailed_cpu_median'), '.0f')} ms"),
                  table_line("decoder jail, child CPU per image",
                             f"{num(cpu.get('jailed'), '.1f')} ms jailed vs "
                             f"{num(cpu.get('unjailed'), '.1f')} ms without "
                             f"(jailed rate {d.jail.jailed_vs_unjailed:.1%} of the unjailed)")]
    targets = []
    if "pipeline_child" in ips:
        r = ips["pipeline_child"] / limit
        targets.append(Target(f"whole pipeline ≥ {DERIVE_PIPELINE_RATIO:.0%} of the component "
                              "limit", f"{ips['pipeline_child']:.2f} / {limit:.2f} img/s per "
                              f"core = **{r:.0%}** (wall clock: "
                              f"{d.pipeline_to_limit_ratio_wall:.0%})",
                              r >= DERIVE_PIPELINE_RATIO))
        if "pipeline_child_unjailed" in ips:
            targets.append(Target(
                f"jailed pipeline keeps ≥ {DERIVE_JAIL_RATIO:.0%} of the component limit",
                f"{ips['pipeline_child']:.2f} / {limit:.2f} img/s per core = **{r:.0%}** "
                f"(without the jail: {ips['pipeline_child_unjailed'] / limit:.0%})",
                r >= DERIVE_JAIL_RATIO))
    targets += [Target(f"two processes ≥ {DERIVE_TWO_VS_ONE}× one",
                       f"**{d.two_vs_one:.2f}×**", d.two_vs_one >= DERIVE_TWO_VS_ONE),
                Target(f"child peak RSS ≤ {DERIVE_CHILD_RSS_MB:.0f} MB (17.9 MP JPEG)",
                       f"{d.child_peak_rss_mb:.0f} MB",
                       d.child_peak_rss_mb <= DERIVE_CHILD_RSS_MB),
                Target(f"bomb rejected in ≤ {DERIVE_BOMB_MS:.0f} ms",
                       f"{d.bomb_rejection_ms:.2f} ms", d.bomb_rejection_ms <= DERIVE_BOMB_MS)]
    if d.owner_switch is not None:
        o = d.owner_switch
        cost = 1 - o.throughput_ratio
        lines += ["", f"Owner change: {o.jobs} jobs; CPU per job (best of rounds) "
                  f"{o.cpu_per_job_ms['same_owner']:.0f} ms of one owner, "
                  f"{o.cpu_per_job_ms['owner_every_job']:.0f} ms with a fresh child for "
                  f"every job ({o.switch_cpu_ms:.0f} ms per change and a throughput of "
                  f"{o.throughput_ratio:.3f}×, medians of the rounds' pairs), "
                  f"{o.cpu_per_job_ms.get('two_owners_two_slots', float('nan')):.0f} ms for "
                  "two owners alternating on two slots (the worker's pick keeps each "
                  "owner's child); a fresh child is a fork of the slot's zygote, "
                  f"{o.cpu_per_job_ms.get('owner_every_job_no_zygote', float('nan')):.0f} ms "
                  "per job when each child starts Python and libvips itself."
                  + ("" if o.tiny_switch_cpu_ms is None else
                     f" With a 64×64 JPEG, whose job costs next to nothing, a change costs "
                     f"{o.tiny_switch_cpu_ms:.1f} ms of CPU (median of rounds): the fresh "
                     "child itself, without a photo's first job in a new heap.")]
        targets.append(Target(
            f"fresh child at each owner change costs ≤ {DERIVE_OWNER_SWITCH_COST:.0%} of "
            "throughput (owner changing at every job)", f"**{cost:.1%}**",
            cost <= DERIVE_OWNER_SWITCH_COST))
    lines += images(["img/images_per_second.png"],
                    {"images_per_second": "Images per second against the limits"})
    return lines, targets


def derive_formats_section(d: DeriveFormatsResult) -> tuple[list[str], list[Target]]:
    """`bench/formats.py`: decode cost per format, and what the thumbs add."""
    lines = ["", f"One {d.photo}, in each format; best of {d.rounds}; CPU time of "
             "one process (one libvips thread, one libheif thread).", ""]
    lines += table(["format", "file size", "derive CPU (preview + thumb + thumbhash)"],
                   [[kind, f"{d.bytes[kind] / 1e6:.2f} MB", f"{ms:.0f} ms"]
                    for kind, ms in d.derive_cpu_ms.items()])
    extra = d.thumb_extra_cpu_share
    sample = d.sample_bytes
    lines += ["", f"Preview {sample['preview']} B, thumb {sample['thumb']} B, thumbhash "
              f"{sample['thumbhash_chars']} chars."]
    target = Target(f"thumb + thumbhash add ≤ {DERIVE_THUMB_EXTRA:.0%} to the preview-only "
                    f"pipeline's CPU ({d.corpus_images} images)",
                    f"{d.corpus_today_cpu_s:.2f} s → {d.corpus_with_thumbs_cpu_s:.2f} s CPU, "
                    f"**+{extra:.1%}**", extra <= DERIVE_THUMB_EXTRA)
    return lines, [target]


def formats_section(src: Source) -> tuple[list[str], list[Target]]:
    return derive_formats_section(load(DeriveFormatsResult, src.data or {}))


def page_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(PageResult, src.data or {})
    b = res.best
    fcp = "–" if b.first_contentful_paint_ms is None else f"{b.first_contentful_paint_ms:.0f} ms"
    lines = ["", f"Headless Chromium (Debian's), 1280×900, a fresh browser context per round, "
             f"against a real API on the embedded PostgreSQL and the local store; "
             f"{res.cards:,} cards of one owner made through the lease protocol (every ninth "
             f"rejected), with real derivatives of the corpus photos. Best of "
             f"{len(res.rounds)} rounds (by the first screen).", ""]
    lines += table(["measure", "result"], [
        ["first contentful paint", fcp],
        ["first screen: every ready card near the viewport shows its thumb",
         f"{b.first_screen_ms:.0f} ms"],
        ["cards rendered on the first screen", f"{b.cards_rendered:,}"],
        ["requests for the first screen", f"{b.requests} ({b.thumb_requests} thumbs)"],
        ["bytes received for the first screen", f"{b.bytes_received / 1e3:,.0f} kB"],
        ["first screen in each round", " / ".join(f"{r.first_screen_ms:.0f}"
                                                  for r in res.rounds) + " ms"],
    ], right_from=99)
    d = res.drain
    lines += ["", f"What pushing status costs the queue: a drain of {d.jobs:,} jobs (claim 100 "
              "→ complete_many) with the card notifications as shipped and with a no-op in "
              "their place, interleaved, one connection listening; best of rounds:", ""]
    lines += table(["notifications", "jobs/s", "drain s"],
                   [[mode, f"{d.jobs_per_s[mode]:,.0f}", f"{d.drain_s[mode]:.2f}"]
                    for mode in ("on", "off")])
    lines += ["", f"They cost **{d.notify_cost_share:+.1%}** of the drain's time."]
    return lines, []


def worker_section(src: Source) -> tuple[list[str], list[Target]]:
    res = WorkerResult.of(src.data or {})
    lines = ["", "End to end = confirm of every image at once to an idle `darkroom worker` "
             "with p slots, until the last card is `ready`; pipeline alone = the same images "
             "through p sandboxed decoder children, no queue, no store. Same run.", ""]
    rows = []
    targets = []
    for r in res.slots:
        p = r.slots
        ratio = r.end_to_end_ips / r.pipeline_alone_ips
        rows.append([str(p), f"{r.pipeline_alone_ips:.2f}", f"{r.end_to_end_ips:.2f}",
                     f"{ratio:.0%}"])
        targets.append(Target(f"end to end ≥ {WORKER_VS_PIPELINE:.0%} of the pipeline alone "
                              f"at {p} slot{'s' * (p > 1)}",
                              f"{r.end_to_end_ips:.2f} / {r.pipeline_alone_ips:.2f} img/s"
                              f" = **{ratio:.0%}**", ratio >= WORKER_VS_PIPELINE))
    lines += table(["slots", "pipeline alone, img/s", "end to end, img/s",
                    "end to end / pipeline alone"], rows)
    lat = res.latency_ms
    if lat:
        lines += ["", f"Idle confirm → processing start (database clock, {lat.samples} single "
                  f"files): p50 {lat.p50:.1f} ms, p95 {lat.p95:.1f} ms, max {lat.max:.1f} ms."]
        targets.append(Target(f"idle confirm → processing start p50 < "
                              f"{WORKER_IDLE_P50_MS:.0f} ms",
                              f"p50 {lat.p50:.1f} ms (the seed polls once a second)",
                              lat.p50 < WORKER_IDLE_P50_MS))
    lines += images(["img/images_per_second.png", "img/latency.png"],
                    {"images_per_second": "Images per second against the limits",
                     "latency": "Confirm latency distribution"})
    return lines, targets


API_PHASES = {"confirm_busy": "confirm, open loop, worker busy",
              "confirm_idle": "confirm, open loop, worker stopped"}


def api_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(ApiResult, src.data or {})
    plan = res.plan
    lines = ["", f"Open loop at {num(plan.get('rate'))} requests/s for "
             f"{plan.get('seconds', '?')} s "
             "per phase (latency from the scheduled send time); ceiling: closed loop, N "
             f"clients for {plan.get('ceiling_seconds', '?')} s.", ""]
    rows = []
    for phase, r in res.results.items():
        m = re.fullmatch(r"ceiling_(\w+?)_(\d+)", phase)
        what = API_PHASES.get(phase) or (f"{m.group(1)}, closed loop, {m.group(2)} clients"
                                          if m else phase)
        srv = r.server
        server = (f"{srv['mean_ms']:.1f} ({srv['within_25ms']:.1%})" if srv.get("count")
                  else "–")
        rows.append([what, num(r.requests), num(r.rps, ",.1f"), num(r.p50_ms, ".1f"),
                     num(r.p95_ms, ".1f"), num(r.p99_ms, ".1f"), num(r.max_ms, ".1f"),
                     num(r.unexpected), server, num(r.cpu_cores.get("api"), ".2f"),
                     num(r.api_cpu_ms_per_request, ".2f"),
                     num(r.cpu_cores.get("steal"), ".2f")])
    lines += table(["phase", "requests", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
                    "unexpected", "server-side mean ms (share ≤ 25 ms)", "API CPU cores",
                    "API CPU ms/request", "cores stolen by the hypervisor"], rows)
    gc_pause = res.gc_full_pass_ms
    if gc_pause:
        lines += ["", f"One full garbage collection in the API process (every request waits "
                  f"for it): {gc_pause['unfrozen']:.1f} ms over {gc_pause['objects']:,.0f} "
                  f"start-up objects, {gc_pause['frozen']:.2f} ms once they are frozen, as "
                  "`create_app` does."]
    targets = []
    busy, idle = res.results.get("confirm_busy"), res.results.get("confirm_idle")
    if busy:
        vs = (f"; {busy.p99_ms / idle.p99_ms:.1f}× the idle p99 of {idle.p99_ms:.1f} ms"
              if idle and idle.p99_ms else "")
        targets.append(Target(f"confirm p99 < {API_P99_MS:.0f} ms at "
                              f"{num(plan.get('rate'))} req/s with a busy worker",
                              f"p99 **{busy.p99_ms:.1f} ms**{vs}",
                              busy.p99_ms < API_P99_MS and not busy.unexpected))
    if busy or idle:
        # The 202 must say `queued` without waiting on image work: any other answer is an
        # "unexpected" in the JSON, whichever phase it happened in.
        confirms = [r for r in (busy, idle) if r]
        bad = sum(r.unexpected for r in confirms)
        sent = sum(r.requests for r in confirms)
        derived = ((busy.worker if busy else None) or {}).get("derived_during_phase")
        targets.append(Target("the 202 never waits for image work",
                              f"{bad} unexpected answers in {sent:,} confirms; the worker "
                              f"derived {num(derived)} images during the busy phase",
                              bad == 0))
    lines += images(["img/latency.png"], {"latency": "Confirm latency distribution"})
    return lines, targets


def soak_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(SoakResult, src.data or {})
    v = res.verdict
    lines = ["", f"{num(v.processed if v else None)} images processed of a target of "
             f"{res.target:,}, uploaded through the HTTP API at {res.rate:,.0f}/s, in "
             f"{res.seconds:,.0f} s ({num(v.throughput_per_s if v else None, '.1f')}/s), "
             f"sampled in {len(res.windows)} windows. First/last = median of the first/last "
             "fifth of the windows.", ""]
    targets = []
    if v:
        rows = [["claim time, first → last", f"{v.claim_ms_first:.2f} → "
                 f"{v.claim_ms_last:.2f} ms ({v.claim_drift:.2f}×)"],
                ["queue indexes (due + leased), max / last",
                 f"{v.queue_index_bytes_max:,} / {v.queue_index_bytes_last:,} bytes"],
                ["archive_files table, last", f"{v.files_table_bytes_last:,} bytes"],
                ["archive_files dead rows, max", f"{v.files_dead_max:,}"],
                ["autovacuums of archive_files", f"{v.autovacuums_files:,}"],
                ["live events, max", f"{v.events_live_max:,}"],
                ["queued, max", f"{v.queued_max:,}"],
                ["confirm p99 of a window, max",
                 f"{num(v.confirm_p99_ms_max, ',.1f')} ms"]]
        lines += table(["figure", "value"], rows, right_from=99)
        targets.append(Target(f"claim time does not drift up (last ≤ {SOAK_DRIFT}× first; "
                              "bound assumed by the report, the issue gives none)",
                              f"**{v.claim_drift:.2f}×**", v.claim_drift <= SOAK_DRIFT))
    lines += images(["img/soak.png"], {"soak": "Soak: claim time, dead rows and sizes"})
    return lines, targets


def fair_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(FairResult, src.data or {})
    plan, summary = res.plan, res.summary
    lines = ["", f"{plan['a_jobs']} cards of owner A waiting; owner B uploads one every "
             f"{plan['b_interval'] * 1000:.0f} ms while A's backlog drains; {res.slots} slots, "
             f"each job {plan['job_seconds'] * 1000:.0f} ms of work; {plan['repeats']} run(s) "
             "of each policy, interleaved. Latency is confirm → claimed on the database's "
             "clock; A vs FIFO = A's jobs/s against FIFO's, same run.", ""]
    fifo = summary.get("fifo")

    def ms(v: float | None) -> str:
        return num(None if v is None else v * 1000)

    rows = [[policy, str(s.b_cards), ms(s.b_wait_p50_s),
             ms(s.b_wait_p95_s), ms(s.b_wait_max_s), num(s.mean_job_s * 1000, ".1f"),
             f"{s.a_jobs_per_s:.1f}",
             f"{s.a_jobs_per_s / fifo.a_jobs_per_s:.1%}" if fifo else "–",
             f"{s.all_jobs_per_s:.1f}"] for policy, s in summary.items()]
    lines += table(["policy", "B cards", "B p50 ms", "B p95 ms", "B max ms", "mean job ms",
                    "A jobs/s", "A vs FIFO", "all jobs/s"], rows)
    if res.confirm_rate:
        rates: dict[int, list[float]] = {}
        for r in res.confirm_rate:
            rates.setdefault(r.owners, []).append(r.per_s)
        clients = res.confirm_rate[0].clients
        lines += ["", f"Confirms per second, {clients} concurrent clients (the owner's clock "
                  "row is locked by each confirm until its commit), median:", ""]
        lines += table(["cards of", "confirms/s"],
                       [[f"{o} owner(s)", f"{statistics.median(v):,.0f}"]
                        for o, v in rates.items()])
    if res.claim_time:
        c0 = res.claim_time[0]
        lines += ["", f"Claim time, median of {plan['claims']} claims (each rolled back):", ""]
        lines += table(["claim", f"{c0.tiny_rows} queued, ms",
                        f"{c0.finished_rows:,} finished + {c0.backlog_rows:,} queued of "
                        f"{c0.owners_waiting:,} owners, ms", "ratio"],
                       [[c.claim, f"{c.ms_10_rows:.3f}", f"{c.ms_backlog:.3f}",
                         f"{c.ms_backlog / c.ms_10_rows:.2f}×"] for c in res.claim_time])
    targets = []
    for policy in ("fair", "fair_bulk"):
        s = summary.get(policy)
        if s is None or fifo is None or s.b_wait_p95_s is None:
            continue
        targets.append(Target(
            f"{policy}: B's p95 confirm → processing ≤ {FAIR_B_WAIT_JOBS:g}× the mean job at "
            f"{res.slots} slots", f"{ms(s.b_wait_p95_s)} ms vs {FAIR_B_WAIT_JOBS:g} × "
            f"{ms(s.mean_job_s)} ms (FIFO: {ms(fifo.b_wait_p95_s)} ms)",
            s.b_wait_p95_s <= FAIR_B_WAIT_JOBS * s.mean_job_s))
        ratio = s.a_jobs_per_s / fifo.a_jobs_per_s
        targets.append(Target(f"{policy}: A's throughput ≥ {FAIR_A_VS_FIFO:.0%} of FIFO's",
                              f"{s.a_jobs_per_s:.1f} vs {fifo.a_jobs_per_s:.1f} jobs/s: "
                              f"**{ratio:.1%}**", ratio >= FAIR_A_VS_FIFO))
    for c in res.claim_time:
        ratio = c.ms_backlog / c.ms_10_rows
        targets.append(Target(f"{c.claim} at {c.finished_rows:,} finished rows, "
                              f"{c.owners_waiting:,} owners waiting, {c.backlog_rows:,} queued "
                              f"within {FAIR_CLAIM_GROWTH}× of a tiny table",
                              f"{c.ms_backlog:.2f} / {c.ms_10_rows:.2f} ms = **{ratio:.2f}×**",
                              ratio <= FAIR_CLAIM_GROWTH))
    mixed_lines, mixed_targets = _fair_mixed(res)
    lines += mixed_lines
    targets += mixed_targets
    lines += images(["img/fair_latency.png", "img/fair_mixed.png"],
                    {"fair_latency": "B's wait while A's backlog drains",
                     "fair_mixed": "Shares of the claims, single uploaders beside a backlog "
                                   "and an import"})
    return lines, targets


def _fair_mixed(res: FairResult) -> tuple[list[str], list[Target]]:
    """The mixed scenario and the claim throughput of the same run."""
    if not res.mixed_summary:
        return [], []
    plan, summary = res.plan, res.mixed_summary
    lines = ["", f"Mixed scenario, one slot, each job {plan['mixed_job_seconds'] * 1000:.0f} "
             f"ms, {plan['mixed_seconds']:.0f} s per run: owner big has "
             f"{plan['mixed_big']} cards waiting, s1, s2 and s3 each upload their next "
             "photo the moment the previous one is ready, and a bulk import of "
             f"{plan['mixed_bulk']} cards waits. Shares of all claims; ideal: start-time "
             f"fair queueing with DARKROOM_BULK_SHARE = {res.bulk_share:g} (bulk its share, "
             "the four interactive owners the rest in equal parts). previous: the rule "
             "before migration 0012 (bench/fair_previous.sql).", ""]
    owners = list(next(iter(summary.values())).ideal)

    def ms(v: float | None) -> str:
        return num(None if v is None else v * 1000)

    rows = [[policy, str(m.claims), *[f"{m.share[o]:.1%}" for o in owners],
             ms(m.single_wait_p50_s), ms(m.single_wait_p95_s), ms(m.single_wait_max_s),
             num(m.mean_job_s * 1000, ".1f"), num(m.claim_interval_s * 1000, ".1f")]
            for policy, m in summary.items()]
    ideal = next(iter(summary.values())).ideal
    rows.append(["ideal", "", *[f"{ideal[o]:.1%}" for o in owners], "", "", "", "", ""])
    lines += table(["policy", "claims", *owners, "singles' wait p50 ms", "p95 ms",
                    "max ms", "mean job ms", "ms per claim"], rows)
    targets = []
    sfq = summary.get("sfq")
    if sfq is not None:
        worst = max(abs(sfq.share[o] / sfq.ideal[o] - 1) for o in owners)
        targets.append(Target(
            f"sfq: every owner's share within ±{FAIR_MIXED_SHARE_SLACK:.0%} of its ideal",
            f"worst **{worst:+.1%}** off", worst <= FAIR_MIXED_SHARE_SLACK))
        floor = res.bulk_share - 1 / max(sfq.claims, 1)
        targets.append(Target(
            f"sfq: bulk's share ≥ DARKROOM_BULK_SHARE ({res.bulk_share:g}, less one claim)",
            f"**{sfq.bulk_share:.1%}**", sfq.bulk_share >= floor))
        if sfq.single_wait_p95_s is not None:
            targets.append(Target(
                f"sfq: a single uploader's p95 wait ≤ {FAIR_MIXED_WAIT_JOBS:g}× the slot's "
                "time per claim (job, commit, next claim)",
                f"{ms(sfq.single_wait_p95_s)} ms vs {FAIR_MIXED_WAIT_JOBS:g} × "
                f"{num(sfq.claim_interval_s * 1000, '.1f')} ms",
                sfq.single_wait_p95_s <= FAIR_MIXED_WAIT_JOBS * sfq.claim_interval_s))
    if res.throughput:
        rates: dict[str, list[float]] = {}
        for t in res.throughput:
            rates.setdefault(t.claim, []).append(t.per_s)
        med = {k: statistics.median(v) for k, v in rates.items()}
        clients = res.throughput[0].clients
        lines += ["", f"Claim throughput: {clients} connections claiming one card at a "
                  f"time, {plan['throughput_claims']:,} claims on {plan['throughput_rows']:,} "
                  "queued cards of 1,000 owners (one in ten bulk), interleaved runs, "
                  "median claims/s:", ""]
        lines += table(["claim", "claims/s", "runs"],
                       [[k, f"{med[k]:,.0f}", ", ".join(f"{x:,.0f}" for x in rates[k])]
                        for k in med])
        if "previous" in med and "sfq" in med:
            ratio = med["sfq"] / med["previous"]
            targets.append(Target(
                f"claims/s with the shared clock row ≥ {FAIR_CLAIM_THROUGHPUT:.0%} of the "
                f"previous claim's ({clients} claimers)",
                f"{med['sfq']:,.0f} vs {med['previous']:,.0f}: **{ratio:.1%}**",
                ratio >= FAIR_CLAIM_THROUGHPUT))
    return lines, targets


def queue_split_section(res: QueueSplitResult) -> list[str]:
    """`bench/queue_split.py`: printed by the script, not part of the report (no target)."""
    lines = [f"Medians of {res.repeats} runs, {res.workers} workers, {res.jobs:,} jobs:", ""]
    rows = []
    for name, runs in res.runs.items():
        def median(of: Callable[[QueueSplitRun], float], runs: list[QueueSplitRun] = runs
                   ) -> float:
            return statistics.median(of(r) for r in runs)

        rows.append([name, f"{median(lambda r: r.jobs_per_s):,.0f}",
                     f"{median(lambda r: r.machine_us_per_job):.1f}",
                     f"{median(lambda r: r.backends_us_per_job):.1f}",
                     f"{median(lambda r: r.python_us_per_job):.1f}"])
    return lines + table(["schema", "jobs/s", "machine µs/job", "backends µs/job",
                          "workers' Python µs/job"], rows)


STORES = {"local": "local", "s3": "SeaweedFS"}


def confirm_digest_section(res: ConfirmDigestResult) -> list[str]:
    """`bench/confirm_digest.py`: printed by the script, not part of the report (no
    target)."""
    rows = [[STORES.get(kind, kind), label, f"{c.bytes:,} B",
             f"{c.plain.median_ms:.2f} / {num(c.plain.p90_ms, '.2f')}",
             f"{c.digest.median_ms:.2f} / {num(c.digest.p90_ms, '.2f')}",
             f"{c.ratio_median:.2f}"]
            for kind, store in res.stores.items() for label, c in store.sizes.items()]
    lines = [f"{res.n} confirms per variant and size, interleaved, one sequential client:",
             ""]
    lines += table(["store", "original", "size", "plain median / p90 ms",
                    "with digest median / p90 ms", "ratio of medians"], rows, right_from=2)
    for kind, store in res.stores.items():
        b = store.plain_vs_baseline
        if b:
            lines += ["", f"{STORES.get(kind, kind)}, plain confirms alternating between "
                      f"this code and the baseline: {b.this.median_ms:.2f} ms vs "
                      f"{b.baseline.median_ms:.2f} ms median (ratio {b.ratio_median:.2f})."]
    return lines


def _backlog_label(c: QueueClaim) -> str:
    """The backlog case: since issue 13 it is the finished rows plus a backlog of many
    owners (`owners_waiting` in the JSON); before, a backlog alone."""
    owners = c.extra.get("owners_waiting")
    if owners:
        return (f"{c.finished_rows:,} finished + {c.backlog_rows:,} queued of "
                f"{owners:,} owners")
    return f"backlog {c.backlog_rows:,} queued"


ENGINES_LABELS = {"pyvips": "bare pyvips", "sharp": "sharp (Immich's engine)",
                  "darkroom": "darkroom end to end"}
# darkroom's stages, in the order an image meets them, and how the section names them.
ENGINES_STAGES = (
    ("api POST /v1/files", "API: create the card"),
    ("api PUT /v1/files/{file_id}/content", "API: upload handling (bytes to the store)"),
    ("api POST /v1/files/{file_id}/confirm", "API: confirm (hash, enqueue)"),
    ("worker fetch", "worker: read the original from the store"),
    ("worker derive_spawn", "decoder: a fresh child (owner change), if any"),
    ("worker derive_send", "decoder: image bytes down to the child"),
    ("worker derive_decode", "decoder: the child's work (decode, encode, thumbhash)"),
    ("worker derive_receive", "decoder: derivatives back from the child"),
    ("worker derive_check", "decoder: the parent checks the WebP (darkroom.webp)"),
    ("worker put", "store: write preview and thumb"),
    ("worker commit", "database: fenced publication"),
)


def engines_ratios(res: EnginesResult, runner: str, baseline: str, *, cpu: bool = False
                   ) -> list[float]:
    """`runner`'s images/s over `baseline`'s, within each round; with `cpu`, its images per
    CPU-second over `baseline`'s (what a machine of its own would give, all else equal)."""
    by = {(r.round, r.runner): r.images / (r.cpu_seconds if cpu else r.seconds)
          for r in res.runs}
    return [by[(n, runner)] / by[(n, baseline)] for n in range(1, res.rounds + 1)
            if (n, runner) in by and (n, baseline) in by]


def engines_section(src: Source) -> tuple[list[str], list[Target]]:
    res = load(EnginesResult, src.data or {})
    v = res.versions
    runners = [r for r in ("pyvips", "sharp", "darkroom") if any(x.runner == r for x in res.runs)]
    lines = ["", f"{len(res.photos)} corpus photos × {res.images_per_round // len(res.photos)} "
             f"= {res.images_per_round} images per round, {res.rounds} interleaved rounds "
             f"(order rotating), {res.parallel} processes or slots, one libvips thread each, "
             f"every process at the same priority. libvips {v.get('libvips', '?')} (pyvips, "
             f"darkroom); sharp {v.get('sharp', '–')} on libvips {v.get('sharp_libvips', '–')}"
             f", node {v.get('node', '–')}. Medians of the rounds; a ratio is taken within "
             "each round, then its median.", ""]
    if res.sharp_missing:
        lines += [f"sharp was skipped: {res.sharp_missing}.", ""]
    rows = []
    for name in runners:
        mine = [r for r in res.runs if r.runner == name]
        rate = statistics.median(r.images / r.seconds for r in mine)
        cpu = statistics.median(1000 * r.cpu_seconds / r.images for r in mine)
        vs = [statistics.median(ratio) if (ratio := engines_ratios(res, name, base, cpu=c))
              else None for c in (False, True) for base in ("sharp", "pyvips")]
        rows.append([ENGINES_LABELS[name], f"{rate:.2f}", f"{cpu:.0f}",
                     *(f"{x:.2f}×" if x is not None else "–" for x in vs),
                     " / ".join(f"{r.images / r.seconds:.2f}" for r in mine)])
    lines += table(["runner", "images/s", "CPU ms per image", "× sharp", "× pyvips",
                    "× sharp per CPU-s", "× pyvips per CPU-s", "each round"], rows)
    quality = {q.runner: q for q in res.quality}
    ref = quality.get("sharp") or quality.get("pyvips")
    lines += ["", "Derivatives of each photo once: bytes, and SSIM of the previews (luminance, "
              "alpha on white) against the original resized by libvips, never compressed.", ""]
    ref_bytes = ref.preview_bytes + ref.thumb_bytes if ref else 0
    lines += table(["runner", "preview KB", "thumb KB", "mean SSIM", "bytes × sharp",
                    "SSIM × sharp"],
                   [[ENGINES_LABELS[q.runner], f"{q.preview_bytes / 1000:.0f}",
                     f"{q.thumb_bytes / 1000:.1f}", f"{q.ssim:.4f}",
                     f"{(q.preview_bytes + q.thumb_bytes) / ref_bytes:.3f}" if ref else "–",
                     f"{q.ssim / ref.ssim:.4f}" if ref else "–"]
                    for q in res.quality])
    dark = [r for r in res.runs if r.runner == "darkroom"]
    if dark and dark[0].cpu_by_process:
        parts = list(dark[0].cpu_by_process)
        lines += ["", "darkroom's CPU per image by process (median of rounds; `client` is the "
                  "uploading bench, not counted above):", ""]
        per_image = {p: statistics.median(1000 * r.cpu_by_process[p] / r.images for r in dark)
                     for p in parts}
        lines += table(["process", "CPU ms per image"],
                       [[p, f"{ms:.1f}"] for p, ms in per_image.items()])
    stages = res.stage_ms_per_image
    named = [(label, stages[key]) for key, label in ENGINES_STAGES if key in stages]
    if named:
        lines += ["", "darkroom's wall time per image by stage (all rounds; the slots and "
                  "the API run in parallel, so the stages overlap and do not add up to "
                  "1 / images/s):", ""]
        lines += table(["stage", "wall ms per image"], [[n, f"{ms:.1f}"] for n, ms in named])
    steps = res.pipeline_cpu_ms
    if steps:
        total = sum(steps.values())
        lines += ["", "The child's work, step by step, in one process on the same photos (CPU "
                  f"ms per image, best of three): {total:.0f} ms in all, "
                  + ", ".join(f"{k.replace('_', ' ')} {ms:.1f} ({ms / total:.0%})"
                              for k, ms in steps.items()) + "."]
    targets = []
    for base, bound in (("sharp", ENGINES_VS_SHARP), ("pyvips", ENGINES_VS_PYVIPS)):
        ratios = engines_ratios(res, "darkroom", base)
        if ratios:
            r = statistics.median(ratios)
            per_cpu = statistics.median(engines_ratios(res, "darkroom", base, cpu=True))
            targets.append(Target(f"darkroom end to end ≥ {bound:.2f}× {ENGINES_LABELS[base]}",
                                  f"**{r:.2f}×** (rounds: "
                                  f"{', '.join(f'{x:.2f}' for x in ratios)}; per CPU-second "
                                  f"{per_cpu:.2f}×)", r >= bound))
    if ref is not None and "darkroom" in quality and ref.runner != "darkroom":
        d = quality["darkroom"]
        size = (d.preview_bytes + d.thumb_bytes) / (ref.preview_bytes + ref.thumb_bytes)
        score = d.ssim / ref.ssim
        targets.append(Target(
            f"derivatives within ±{ENGINES_QUALITY_SLACK:.0%} of {ref.runner}'s in bytes and "
            "SSIM", f"bytes **{size:.3f}×**, SSIM **{score:.4f}×**",
            abs(size - 1) <= ENGINES_QUALITY_SLACK and abs(score - 1) <= ENGINES_QUALITY_SLACK))
    lines += images(["img/engines.png"], {"engines": "darkroom end to end against the bare "
                                          "engines"})
    return lines, targets


Renderer = Callable[[Source], tuple[list[str], list[Target]]]
# The report's benchmarks (bench/runs.py BENCHES), each by its one renderer.
RENDERERS: dict[str, Renderer] = {
    "queue": queue_section, "fair": fair_section, "derive": derive_section,
    "worker": worker_section, "api": api_section, "soak": soak_section,
    "engines": engines_section, "formats": formats_section, "page": page_section}


def publish(name: str, result: Any, path: Path | None = None) -> None:
    """Write a result just measured to its file and print it through its benchmark's
    renderer: the same tables and targets the report splices into docs/BENCHMARKS.md."""
    path = path or BY_NAME[name].json_path
    save(result, path)
    lines, targets = RENDERERS[name](Source.of(BY_NAME[name], dataclasses.asdict(result)))
    table_lines = ["", *targets_table(targets)] if targets else []
    print("\n".join([*lines, *table_lines, "", f"JSON: {path}"]))
