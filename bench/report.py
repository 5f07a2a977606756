"""Benchmark report: rerun every benchmark, draw the plots, regenerate docs/BENCHMARKS.md.

    .venv/bin/python -m bench.report [--quick] [--skip NAME ...] [--from-json]

1. Runs bench.queue, bench.fair, bench.derive, bench.worker, bench.api and bench.soak
   (those whose script exists) one after the other, each as its own `python -m bench.NAME`
   subprocess so that each has the machine to itself. `--quick` passes each its small
   mode. `--skip NAME` does not rerun NAME but still reports its last JSON (marked as
   such). `--from-json` reruns nothing and only re-renders from bench/out/*.json.
2. Draws PNG plots into docs/img/ (matplotlib, Agg): every figure shows a ratio to a
   baseline measured in the same run of the same benchmark, and carries the machine it ran
   on (CPUs, CPU model, PostgreSQL version, date) in its caption.
3. Regenerates docs/BENCHMARKS.md. Only the text between
   `<!-- report:NAME:start -->` and `<!-- report:NAME:end -->` is rewritten; everything else
   (the hand-written analysis under each section) is kept as it is. A `## ... (bench/NAME.py)`
   section without markers gets its block inserted under its heading; a benchmark with no
   section gets one appended. A benchmark whose JSON this checkout does not have (bench/out/
   is not in git) keeps its block, its plots and its intro row exactly as published.

Run records (command, start, duration, exit code) go to bench/out/report.json so that a
later `--from-json` still names the exact command and date of each figure.

Each job has its own module; this one only strings them together:
  bench/runs.py        which benchmarks there are, running one, the run records
  bench/provenance.py  which JSON, command, date and machine a figure comes from
  bench/results.py     each benchmark's result as a typed file (written and read)
  bench/sections.py    one renderer per benchmark: its Markdown tables and its targets
  bench/targets.py     every target threshold
  bench/plots.py       the figures
  bench/splice.py      the marked blocks of docs/BENCHMARKS.md
Shared helpers: bench/cpu.py (/proc, CPU model), bench/stats.py (percentiles),
tests/support/services.py (free_port).
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from collections.abc import Callable

from bench import plots
from bench.markdown import Target
from bench.provenance import embedded_pg_version, source_for
from bench.runs import BENCHES, OUT, ROOT, load_runs, run_bench, save_runs
from bench.sections import RENDERERS
from bench.splice import DOC, START, block, intro, section_body, write_doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--quick", action="store_true",
                        help="each benchmark's small mode (smoke test, not for publishing)")
    parser.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                        choices=[b.name for b in BENCHES],
                        help="do not rerun these; report their last JSON")
    parser.add_argument("--from-json", action="store_true",
                        help="rerun nothing; re-render from bench/out/*.json")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")  # no display; and before pyplot is imported anywhere
    OUT.mkdir(parents=True, exist_ok=True)
    runs = load_runs()
    this_run: set[str] = set()
    pg_now = embedded_pg_version()
    if not args.from_json:
        for b in BENCHES:
            if b.name in args.skip:
                continue
            if not b.script.exists():
                print(f"=== bench/{b.name}.py does not exist; skipped", flush=True)
                continue
            runs[b.name] = run_bench(b, args.quick)
            this_run.add(b.name)
            # Saved after each benchmark, so an interrupted report keeps what it measured.
            save_runs(runs)

    sources = {b.name: source_for(b, runs.get(b.name), b.name in this_run,
                                  b.name in args.skip, pg_now) for b in BENCHES}
    blocks: dict[str, str] = {}
    all_targets: dict[str, list[Target]] = {}
    kept: set[str] = set()
    failed = False
    for b in BENCHES:
        src = sources[b.name]
        lines: list[str] = []
        targets: list[Target] = []
        if src.data is not None:
            try:
                lines, targets = RENDERERS[b.name](src)
            except Exception:  # a JSON whose shape moved must not cost the other sections
                traceback.print_exc()
                failed = True
                src.note = (f"bench/report.py could not render `bench/out/{b.name}.json` "
                            f"(shape changed?): {traceback.format_exc().splitlines()[-1]}")
                src.status += "; NOT RENDERED"
        all_targets[b.name] = targets
        doc = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if src.data is None and b.name not in this_run and START.format(b.name) in doc:
            # bench/out/ is not in git: a checkout that did not run this benchmark keeps
            # the figures the document already has instead of erasing them.
            kept.add(b.name)
            continue
        # A benchmark with no JSON and no section of its own gets only its intro row.
        has_section = re.search(rf"\(bench/{b.name}\.py\)", doc)
        if src.data is not None or has_section:
            blocks[b.name] = block(b.name, section_body(src, lines, targets))
    # The figures that combine several benchmarks' JSON, each on its own: one that fails
    # must not cost the others.
    draws: tuple[tuple[tuple[str, ...], Callable[[], str | None]], ...] = (
        (("queue",), lambda: plots.queue_throughput_plot(sources["queue"])),
        (("queue",), lambda: plots.queue_claim_plot(sources["queue"])),
        (("fair",), lambda: plots.fair_plot(sources["fair"])),
        (("fair",), lambda: plots.fair_mixed_plot(sources["fair"])),
        (("derive", "worker"), lambda: plots.images_plot(sources["derive"], sources["worker"])),
        (("api", "worker", "queue"),
         lambda: plots.latency_plot(sources["api"], sources["worker"], sources["queue"])),
        (("soak",), lambda: plots.soak_plot(sources["soak"])),
        (("engines",), lambda: plots.engines_plot(sources["engines"])))
    for needs, draw in draws:
        if kept.intersection(needs):
            continue  # drawn from figures this checkout does not have: keep the old plot
        try:
            draw()
        except Exception:
            traceback.print_exc()
            failed = True
    mode = ("from existing JSON (`--from-json`)" if args.from_json else
            "quick sizes (`--quick`)" if args.quick else "full run")
    blocks = {"intro": block("intro", intro(sources, all_targets, mode, kept)), **blocks}
    write_doc(blocks)
    print(f"\nwrote {DOC.relative_to(ROOT)} and {plots.IMG.relative_to(ROOT)}/*.png")
    for b in BENCHES:
        print(f"  {b.name:7} {sources[b.name].status}")
        for t in all_targets.get(b.name, []):
            print(f"          {'met   ' if t.met else 'NOT met'} {t.what}")
    bad_runs = [n for n in this_run if runs[n]["exit_code"] != 0]
    return 1 if failed or bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
