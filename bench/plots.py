"""The figures of docs/BENCHMARKS.md (matplotlib, Agg, PNG into docs/img/).

Every figure shows a ratio to a baseline measured in the same run of the same benchmark,
and carries the machine and command of every JSON it draws in its caption.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from bench import targets
from bench.markdown import num
from bench.provenance import Source
from bench.results import (
    ApiResult,
    DeriveResult,
    EnginesResult,
    FairResult,
    QueueResult,
    WorkerResult,
    load,
)
from bench.sections import (
    API_PHASES,
    ENGINES_STAGES,
    QUEUE_LABELS,
    best,
    engines_ratios,
    series_of,
)
from bench.stats import percentile

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
CAPTION_LINE_IN = 0.16  # one 7.5 pt caption line, in inches


def figure(title: str, sources: list[Source], ncols: int = 2) -> tuple[Any, Any]:
    """`ncols` panels, and a caption naming the machine and command of every source drawn:
    a figure may combine JSONs from runs of different dates."""
    import matplotlib.pyplot as plt

    # The figure grows by the caption's height, so the panels keep their size.
    height = 4.8 + CAPTION_LINE_IN * len(sources)
    # A single panel stays wide enough for its caption line.
    width = {1: 8.0, 2: 12.4}.get(ncols, 5.4 * ncols)
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), dpi=100)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    caption = "\n".join(f"{s.bench.name}: {s.caption()}   ({s.short_command()})"
                        for s in sources)
    fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=7.5, color="#444")
    return fig, axes


def save(fig: Any, name: str) -> str:
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    # Leave room at the bottom for the caption, one line per source.
    lines = fig.texts[0].get_text().count("\n") + 1 if fig.texts else 1
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, (0.1 + CAPTION_LINE_IN * lines) / height, 1, 1 - 0.3 / height))
    fig.savefig(IMG / name)
    plt.close(fig)
    return f"img/{name}"


def target_line(ax: Any, value: float, label: str, x: float = 0.0, above: float = 1.1,
                line: tuple[str, str] = ("k", "--"), **text: Any) -> None:
    """A target as a horizontal line, labelled just above it (`above` × its value)."""
    color, style = line
    ax.axhline(value, color=color, ls=style, lw=1)
    ax.text(x, value * above, label, **({"fontsize": 8} | text))


def no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=10, color="#666",
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])



QUEUE_STYLE = {"darkroom": ("C0", "o", "-"), "darkroom (proposed claim fix)": ("C0", "o", "--"),
               "pgqueuer": ("C1", "s", "-"), "procrastinate": ("C2", "^", "-"),
               "seed": ("C3", "x", "-"), "darkroom (batched complete)": ("C9", "o", "--")}



def queue_throughput_plot(src: Source) -> str | None:
    tp = load(QueueResult, src.data or {}).throughput
    if not tp:
        return None
    series = series_of(tp)
    counts = sorted({r.workers for r in tp})
    fig, (ax, ax_r) = figure("No-op queue throughput against worker processes", [src])
    for (system, config), per in series.items():
        color, marker, ls = QUEUE_STYLE.get(system, ("C7", ".", "-"))
        if system == "pgqueuer" and "batch_size 10," in config + ",":
            ls = ":"  # the default batch: same colour as PgQueuer's best, dotted
        if system == "darkroom" and (top := best(tp, None, system)) and config != top.config:
            ls = ":"  # not its best: same colour as darkroom's best, dotted
        ws = sorted(per)
        med = [per[w].median for w in ws]
        lo = [m - min(per[w].runs_jobs_per_s or [m]) for w, m in zip(ws, med, strict=True)]
        hi = [max(per[w].runs_jobs_per_s or [m]) - m for w, m in zip(ws, med, strict=True)]
        label = f"{QUEUE_LABELS.get(system, system)} ({config})"
        ax.errorbar(ws, med, yerr=[lo, hi], color=color, marker=marker, ls=ls, capsize=3,
                    label=label)
        ratios = [(w, per[w].median / b.median) for w in ws
                  if (b := best(tp, w))]
        if ratios:
            ax_r.plot(*zip(*ratios, strict=True), color=color, marker=marker, ls=ls,
                      label=label)
    for a in (ax, ax_r):
        a.set_xscale("log", base=2)
        a.set_xticks(counts, [str(w) for w in counts])
        a.set_xlabel("worker processes")
        a.set_yscale("log")
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("jobs/s (median; bars: min–max of runs)")
    ax.set_title("absolute", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    target_line(ax_r, targets.QUEUE_VS_PGQUEUER, f"target {targets.QUEUE_VS_PGQUEUER}×",
                counts[0], above=1.08)
    ax_r.axhline(1.0, color="C1", lw=0.8, alpha=0.6)
    ax_r.set_ylabel("× PgQueuer's best configuration at the same worker count")
    ax_r.set_title("ratio to PgQueuer's best, same run", fontsize=10)
    plain_log_ticks(ax_r)
    return save(fig, "queue_throughput.png")


def queue_claim_plot(src: Source) -> str | None:
    claims = load(QueueResult, src.data or {}).claim_time
    if not claims:
        return None
    fig, (ax, ax_r) = figure("Claim time against table size", [src])
    c0 = claims[0]
    tiny = c0.tiny_rows
    big = c0.finished_rows + c0.queued_rows
    # Three darkroom variants share the throughput plot's blue there; here they must be
    # told apart, so each claim gets its own colour.
    palette = iter(["#6baed6", "C0", "C9", "C4", "C5"])
    for i, c in enumerate(claims):
        color, marker, ls = QUEUE_STYLE.get(c.system, ("C7", ".", "-"))
        if c.system.startswith("darkroom"):
            color = next(palette)
        label = f"{QUEUE_LABELS.get(c.system, c.system)} {c.claim}"
        ax.plot([tiny, big], [c.ms_10_rows, c.ms_big], color=color, marker=marker,
                ls=ls, label=label)
        scen = [("finished\n+ queued", c.ms_big)]
        if c.ms_backlog:
            scen.append((f"backlog\n{c.backlog_rows:,} queued", c.ms_backlog))
        for j, (_, ms) in enumerate(scen):
            x = j + (i - (len(claims) - 1) / 2) * 0.18
            ratio = ms / c.ms_10_rows
            ax_r.bar(x, ratio, width=0.17, color=color, edgecolor="white",
                     label=label if j == 0 else None)
            ax_r.text(x, ratio * 1.08, f"{ratio:.1f}×" if ratio < 100 else f"{ratio:.0f}×",
                      ha="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in archive_files (tiny: queued only; big: finished + queued)")
    ax.set_ylabel("median claim time, ms")
    ax.set_title("absolute", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax_r.set_xticks([0, 1], [f"{c0.finished_rows:,} finished\n+ {c0.queued_rows:,} queued",
                             f"backlog: {c0.backlog_rows:,} queued"])
    ax_r.set_yscale("log")
    growth = targets.QUEUE_CLAIM_GROWTH
    target_line(ax_r, growth, f"target ≤ {growth}× (finished rows only)", 0.5, fontsize=7.5,
                ha="center",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ax_r.axhline(1.0, color="#888", lw=0.8)
    ax_r.set_ylabel(f"× claim time on the tiny table ({tiny} queued rows)")
    ax_r.set_title("ratio to the tiny table, same run", fontsize=10)
    ax_r.grid(True, axis="y", which="both", alpha=0.3)
    plain_log_ticks(ax_r)
    ax_r.set_ylim(top=ax_r.get_ylim()[1] * 30)  # headroom for the legend above the bars
    ax_r.legend(fontsize=7, loc="upper center", ncol=2)
    return save(fig, "queue_claim_time.png")


def plain_log_ticks(ax: Any) -> None:
    """1×, 10× rather than 10^0, 10^1: the axis is read as a ratio."""
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))



def images_plot(derive: Source, worker: Source) -> str | None:
    drawn = [s for s in (derive, worker) if s.data]
    if not drawn:
        return None
    fig, (ax, ax_w) = figure("Images per second against the pipeline limit", drawn)
    d = load(DeriveResult, derive.data) if derive.data else None
    ips = d.images_per_second_per_core if d else {}
    limit = d.component_limit if d else 0.0
    ratio_target = targets.DERIVE_PIPELINE_RATIO
    if ips and limit:
        bars = [("decode+resize\nalone", "decode_resize", "#9ecae1"),
                ("encode\nalone", "encode", "#9ecae1"),
                ("pipeline\n(child)", "pipeline_child", "C0"),
                ("pipeline\n(in process)", "pipeline_in_process", "#6baed6"),
                ("Pillow,\nsame job", "pillow", "C1")]
        bars = [b for b in bars if b[1] in ips]
        xs = range(len(bars))
        vals = [ips[k] / limit for _, k, _ in bars]
        # Linear and clipped: the question is a few percent around 1×, which a log axis
        # stretched to decode+resize's ~10× would flatten. Clipped bars say their value.
        top = 1.4
        ax.bar(xs, [min(v, top) for v in vals], color=[c for *_, c in bars])
        for x, (_, k, _), v in zip(xs, bars, vals, strict=True):
            clipped = v > top
            ax.text(x, (top - 0.12) if clipped else v + 0.02,
                    f"{v:.2f}×{' ↑' if clipped else ''}\n{ips[k]:.2f}/s", ha="center",
                    fontsize=7.5, color="white" if clipped else "k")
        ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
        ax.set_ylim(0, top)
        ax.axhline(1.0, color="k", lw=1)
        ax.axhline(ratio_target, color="k", ls="--", lw=1)
        ax.text(-0.45, ratio_target - 0.02, f"target: pipeline ≥ {ratio_target:.0%}",
                fontsize=8, va="top")
        ax.set_ylabel(f"× component limit ({limit:.2f} img/s per core)")
        ax.set_title("bench.derive: per core, ratio to the same run's component limit\n"
                     "limit = 1 / (t_decode+resize + t_encode)", fontsize=9.5)
        plain_log_ticks(ax)
        ax.grid(True, axis="y", alpha=0.3)
    else:
        no_data(ax, "bench/out/derive.json: no per-core rates")
    slots = WorkerResult.of(worker.data).slots if worker.data else []
    if slots:
        width = 0.38
        share = targets.WORKER_VS_PIPELINE
        for i, r in enumerate(slots):
            ratio = r.end_to_end_ips / r.pipeline_alone_ips
            ax_w.bar(i - width / 2, r.pipeline_alone_ips, width, color="#9ecae1",
                     label="pipeline alone" if i == 0 else None)
            ax_w.bar(i + width / 2, r.end_to_end_ips, width, color="C0",
                     label="end to end (worker)" if i == 0 else None)
            ax_w.text(i + width / 2, r.end_to_end_ips * 1.02, f"{ratio:.0%}\nof alone",
                      ha="center", fontsize=8, fontweight="bold" if ratio < share else None,
                      color="C3" if ratio < share else "k")
            ax_w.hlines(r.pipeline_alone_ips * share, i, i + width, colors="k",
                        linestyles="--", lw=1,
                        label=f"target {share:.0%} of alone" if i == 0 else None)
        ax_w.set_xticks(range(len(slots)),
                        [f"{r.slots} slot{'s' * (r.slots > 1)}" for r in slots])
        ax_w.set_ylabel("images/s (wall clock)")
        top = max(max(r.pipeline_alone_ips, r.end_to_end_ips) for r in slots)
        ax_w.set_ylim(0, top * 1.3)
        ax_w.legend(fontsize=8, loc="upper left")
        ax_w.set_title(f"bench.worker ({worker.date}): end to end vs pipeline alone",
                       fontsize=9.5)
        ax_w.grid(True, axis="y", alpha=0.3)
    else:
        no_data(ax_w, "bench/out/worker.json not present:\nno end-to-end figures")
    return save(fig, "images_per_second.png")



def percentiles_line(ax: Any, values: list[float | None], color: str, marker: str,
                     label: str) -> None:
    """One latency distribution as a line over p50, p95, … with each value written on
    it; a missing percentile is left out."""
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    ax.plot(*zip(*pts, strict=True), marker=marker, color=color, label=label)
    for i, v in pts:
        ax.text(i, v * 1.12, f"{v:.1f}", ha="center", fontsize=7.5, color=color)


def latency_plot(api: Source, worker: Source, queue: Source) -> str | None:
    drawn = [s for s in (api, worker, queue) if s.data]
    if not drawn:
        return None
    fig, (ax, ax_w) = figure("Confirm latency distribution", drawn)
    qs = ["p50", "p95", "p99", "max"]
    api_res = load(ApiResult, api.data) if api.data else None
    phases = api_res.results if api_res else {}
    for phase, color in (("confirm_busy", "C3"), ("confirm_idle", "C0")):
        r = phases.get(phase)
        if not r:
            continue
        percentiles_line(ax, [getattr(r, f"{q}_ms") for q in qs], color, "o",
                         f"{API_PHASES[phase]} ({r.requests} requests)")
    if api_res and phases:
        busy, idle = phases.get("confirm_busy"), phases.get("confirm_idle")
        target_line(ax, targets.API_P99_MS, f"target p99 < {targets.API_P99_MS:.0f} ms")
        ax.set_xticks(range(len(qs)), qs)
        ax.set_yscale("log")
        ax.set_ylabel("ms, scheduled send → response")
        ratio = (f"busy p99 = {busy.p99_ms / idle.p99_ms:.1f}× idle p99"
                 if busy and idle and idle.p99_ms else "")
        rate = api_res.plan.get("rate")
        ax.set_title(f"bench.api: POST confirm at {num(rate)} req/s ({api.date})\n{ratio}",
                     fontsize=9.5)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(top=ax.get_ylim()[1] * 2)
    else:
        no_data(ax, "bench/out/api.json not present:\nno HTTP confirm latency in this report")
    # Right: idle wake-up, the worker's confirm → start and the queue's enqueue → claim;
    # the seed's 1 s poll is the same-run baseline.
    lines: list[tuple[str, dict[str, Any], str, str]] = []
    wl = WorkerResult.of(worker.data).latency_ms if worker.data else None
    if wl:
        lines.append((f"worker: confirm → processing start, {wl.samples} files",
                      {f"{q}_ms": getattr(wl, q, None) for q in qs}, "C0", "o"))
    ql = load(QueueResult, queue.data).latency if queue.data else {}
    for name, color, marker in (("darkroom", "C2", "s"), ("pgqueuer", "C1", "D"),
                                ("procrastinate", "C4", "^"), ("seed", "C3", "x")):
        stats = ql.get(name)
        if stats and stats.n:
            lines.append((f"queue: {QUEUE_LABELS[name]} enqueue → start, {stats.n} jobs",
                          dataclasses.asdict(stats), color, marker))
    for label, pcts, color, marker in lines:
        percentiles_line(ax_w, [pcts.get(f"{q}_ms") for q in qs], color, marker, label)
    if lines:
        target_line(ax_w, targets.WORKER_IDLE_P50_MS,
                    f"worker target p50 < {targets.WORKER_IDLE_P50_MS:.0f} ms", 1.5)
        target_line(ax_w, targets.QUEUE_IDLE_P50_MS,
                    f"queue target p50 < {targets.QUEUE_IDLE_P50_MS:.0f} ms", 1.5, above=0.7,
                    line=("#888", ":"), color="#666")
        ax_w.set_xticks(range(len(qs)), qs)
        ax_w.set_yscale("log")
        ax_w.set_ylabel("ms")
        dr = ql.get("darkroom")
        ratio = ", ".join(f"{QUEUE_LABELS[n]} {s.p50_ms / dr.p50_ms:.1f}×"
                          for n, s in ql.items()
                          if dr and dr.p50_ms and n != "darkroom" and s.p50_ms)
        ax_w.set_title("idle wake-up latency"
                       + (f"\nqueue p50 × darkroom's, same run: {ratio}" if ratio else ""),
                       fontsize=9.5)
        ax_w.legend(fontsize=7.5, loc="upper left")
        ax_w.grid(True, which="both", alpha=0.3)
        ax_w.set_ylim(top=ax_w.get_ylim()[1] * 4)
    else:
        no_data(ax_w, "no worker.json or queue.json latency")
    return save(fig, "latency.png")



QUEUE_INDEXES = ("archive_files_due", "archive_files_leased")


def soak_plot(src: Source) -> str | None:
    windows: list[dict[str, Any]] = (src.data or {}).get("windows") or []
    if not windows:
        return None
    fig, (ax, ax_d, ax_s) = figure("Soak: drift of the claim time, dead rows and sizes",
                                    [src], ncols=3)
    t = [w["t"] for w in windows]
    k = max(1, len(windows) // 5)  # the verdict's own baseline: the first fifth
    base = statistics.median(w["claim_ms"] for w in windows[:k])
    ax.plot(t, [w["claim_ms"] / base for w in windows], "o-", color="C0",
            label="claim time / first windows'")
    ax.axhline(1.0, color="#888", lw=0.8)
    ax.axhline(targets.SOAK_DRIFT, color="k", ls="--", lw=1,
               label=f"{targets.SOAK_DRIFT}× (assumed bound)")
    ax.set_xlabel("elapsed s")
    ax.set_ylabel(f"× first windows' claim time ({base:.2f} ms)")
    lat = [(w["t"], w["confirm_ms"]) for w in windows if w.get("confirm_ms")]
    ax2 = ax.twinx()
    ax2.plot([x for x, _ in lat], [c["p99"] for _, c in lat], "s:", color="C3", ms=3,
             label="confirm p99 (right, ms)")
    ax2.set_yscale("log")
    ax2.set_ylabel("confirm p99 of the window, ms", color="C3")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7.5, loc="upper left")
    ax.set_title("claim time relative to the start, same run", fontsize=9.5)
    ax.grid(True, alpha=0.3)
    for table_name, key, color in (("archive_files", "dead", "C1"),
                                   ("archive_events", "live", "C2"),
                                   ("orphan_objects", "dead", "C4")):
        ys = [(w.get("tables") or {}).get(table_name, {}).get(key) for w in windows]
        if any(y is not None for y in ys):
            ax_d.plot(t, [y or 0 for y in ys], "o-", ms=3, color=color,
                      label=f"{table_name}: {key} rows")
    ax_d.plot(t, [w["counts"].get("queued", 0) for w in windows], "x-", ms=3, color="C7",
              label="queued (queue depth)")
    ax_d.set_xlabel("elapsed s")
    ax_d.set_ylabel("rows")
    ax_d.set_title("must stay bounded: dead rows, event log, backlog", fontsize=9.5)
    ax_d.legend(fontsize=7.5, loc="upper left")
    ax_d.grid(True, alpha=0.3)
    kib = 1024.0
    ax_s.plot(t, [sum(w["sizes"].get(n, 0) for n in QUEUE_INDEXES) / kib for w in windows],
              "o-", ms=3, color="C0", label="queue indexes (due + leased)")
    ax_s.plot(t, [w["sizes"].get("archive_files", 0) / kib for w in windows], "o-", ms=3,
              color="C1", label="archive_files (heap)")
    ax_s.plot(t, [w["sizes"].get("archive_events", 0) / kib for w in windows], "o-", ms=3,
              color="C2", label="archive_events (heap)")
    ax_s.set_xlabel("elapsed s")
    ax_s.set_ylabel("KiB")
    ax_s.set_title("table and index sizes", fontsize=9.5)
    ax_s.legend(fontsize=7.5, loc="upper left")
    ax_s.grid(True, alpha=0.3)
    return save(fig, "soak.png")


FAIR_COLORS = {"fifo": "#c0392b", "fair": "#2e86c1", "fair_bulk": "#27ae60"}


def fair_plot(src: Source) -> str | None:
    res = load(FairResult, src.data or {})
    if not res.runs:
        return None
    fig, ax = figure(f"Owner B's wait while A's {res.plan['a_jobs']} cards drain "
                     f"({res.slots} slots)", [src], ncols=1)
    for policy, color in FAIR_COLORS.items():
        waits = sorted(w * 1000 for r in res.runs if r.policy == policy for w in r.b_wait_s)
        if waits:
            ax.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], color=color,
                    label=f"{policy} (p95 {percentile(waits, 0.95):.0f} ms)")
    fair = res.summary.get("fair")
    if fair:
        bound = targets.FAIR_B_WAIT_JOBS * fair.mean_job_s * 1000
        ax.axvline(bound, color="k", ls="--", lw=1,
                   label=f"target: {targets.FAIR_B_WAIT_JOBS:g} × mean job ({bound:.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("owner B: confirm → processing, ms (log)")
    ax.set_ylabel("share of B's cards")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, "fair_latency.png")


MIXED_COLORS = {"fifo": "#c0392b", "previous": "#e67e22", "sfq": "#2e86c1"}


def fair_mixed_plot(src: Source) -> str | None:
    """Each owner's share of the claims per policy, beside its ideal (the mixed scenario)."""
    res = load(FairResult, src.data or {})
    if not res.mixed_summary:
        return None
    fig, ax = figure("Shares of the claims: single uploaders beside a backlog and an import "
                     "(1 slot)", [src], ncols=1)
    owners = list(next(iter(res.mixed_summary.values())).ideal)
    width = 0.8 / (len(res.mixed_summary) + 1)
    for i, (policy, m) in enumerate(res.mixed_summary.items()):
        ax.bar([j + i * width for j in range(len(owners))], [m.share[o] for o in owners],
               width, color=MIXED_COLORS.get(policy, "#888"), label=policy)
    ideal = next(iter(res.mixed_summary.values())).ideal
    ax.bar([j + len(res.mixed_summary) * width for j in range(len(owners))],
           [ideal[o] for o in owners], width, color="none", edgecolor="k", hatch="//",
           label=f"ideal (bulk share {res.bulk_share:g})")
    ax.set_xticks([j + width * len(res.mixed_summary) / 2 for j in range(len(owners))],
                  owners)
    ax.set_ylabel("share of all claims")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return save(fig, "fair_mixed.png")


def engines_plot(src: Source) -> str | None:
    """darkroom end to end against bare pyvips and sharp (median images/s of the rounds,
    the ratio to sharp above each bar), and darkroom's wall time per image by stage."""
    if src.data is None:
        return None
    res = load(EnginesResult, src.data)
    fig, (ax, ax2) = figure("darkroom end to end against the bare engines", [src])
    runners = [r for r in ("pyvips", "sharp", "darkroom") if any(x.runner == r for x in res.runs)]
    rates = [statistics.median(x.images / x.seconds for x in res.runs if x.runner == r)
             for r in runners]
    cpu = [statistics.median(1000 * x.cpu_seconds / x.images for x in res.runs if x.runner == r)
           for r in runners]
    bars = ax.bar(list(runners), rates, color=["C2", "C1", "C0"][
        :len(runners)] if len(runners) == 3 else None)
    base = "sharp" if "sharp" in runners else "pyvips"
    for bar, runner, ms in zip(bars, runners, cpu, strict=True):
        ratio = engines_ratios(res, runner, base)
        label = f"{statistics.median(ratio):.2f}× {base}\n" if ratio else ""
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{label}{ms:.0f} ms CPU/img", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("images/s (median of rounds)")
    ax.set_title(f"{res.images_per_round} images × {res.rounds} rounds, {res.parallel} "
                 "processes or slots", fontsize=9)
    ax.set_ylim(0, max(rates) * 1.3)
    named = [(label, res.stage_ms_per_image[key]) for key, label in ENGINES_STAGES
             if key in res.stage_ms_per_image]
    if named:
        ax2.barh([n for n, _ in named][::-1], [ms for _, ms in named][::-1], color="C0")
        ax2.set_xscale("log")
        ax2.set_xlabel("darkroom, wall ms per image (log)")
        ax2.tick_params(axis="y", labelsize=7)
        ax2.set_title("by stage (stages overlap across slots)", fontsize=9)
    else:
        no_data(ax2, "no stage histograms")
    return save(fig, "engines.png")
