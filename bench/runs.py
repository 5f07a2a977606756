"""Running the benchmarks: which there are, their small modes, and the record of each run.

Each benchmark runs as its own `python -m bench.NAME` subprocess, so that each has the
machine to itself; the record (command, start, duration, exit code) goes to
bench/out/report.json so that a later `--from-json` still names the exact command and date
of each figure.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
RUNS = OUT / "report.json"
PY = ".venv/bin/python"  # as the docs spell it; the subprocesses use sys.executable


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    # Small mode per script: queue and fair have a --quick; the others get short sizes
    # through their own options. None means "ask the script's --help whether it has --quick".
    quick_args: tuple[str, ...] | None
    optional: bool = False  # absent script or JSON is a note, not an error

    @property
    def script(self) -> Path:
        return ROOT / "bench" / f"{self.name}.py"

    @property
    def json_path(self) -> Path:
        return OUT / f"{self.name}.json"


BENCHES = (
    Bench("queue", "Queue", ("--quick",)),
    Bench("fair", "Fair share", ("--quick",)),
    Bench("derive", "Derivatives", ("--rounds", "1")),
    Bench("worker", "Worker", ("--images", "12", "--latency-samples", "10")),
    Bench("api", "API", ("--seconds", "5", "--warmup-seconds", "1", "--ceiling-seconds",
                         "2", "--ceiling-cards", "600"), optional=True),
    # soak.py has no small mode of its own; 1,500 images at 100/s is about a minute.
    Bench("soak", "Soak", ("--images", "1500", "--rate", "100", "--sample", "5"),
          optional=True),
    Bench("engines", "Against the bare engines", ("--rounds", "1", "--copies", "1"),
          optional=True),
    Bench("formats", "Formats and thumbnails", ("--rounds", "1")),
    # Needs Chromium: a machine without it keeps the published block.
    Bench("page", "Page with 2,000 cards", ("--rounds", "1", "--jobs", "400"), optional=True),
)
BY_NAME = {b.name: b for b in BENCHES}


def command(name: str) -> str:
    """This process's command line as a result records it: how to run it again."""
    return shlex.join([PY, "-m", f"bench.{name}", *sys.argv[1:]])


def quick_args(bench: Bench) -> tuple[str, ...]:
    if bench.quick_args is not None:
        return bench.quick_args
    helptext = subprocess.run([sys.executable, "-m", f"bench.{bench.name}", "--help"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    return ("--quick",) if "--quick" in helptext else ()


def run_bench(bench: Bench, quick: bool) -> dict[str, Any]:
    """Run one benchmark to completion; its output goes to the console and a log file."""
    args = quick_args(bench) if quick else ()
    # As a module from the repository root: as a script, bench/ would be sys.path[0] and
    # bench/queue.py would shadow the standard library's `queue`.
    argv = [sys.executable, "-m", f"bench.{bench.name}", *args]
    command = shlex.join([PY, "-m", f"bench.{bench.name}", *args])
    log_path = OUT / f"{bench.name}.log"
    print(f"\n=== {command}  (log: {log_path.relative_to(ROOT)})", flush=True)
    started = time.time()
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:  # tee: progress on the console, everything in the log
            sys.stdout.write(line)
            log.write(line)
        code = proc.wait()
    finished = time.time()
    print(f"=== exit {code} after {finished - started:.0f} s", flush=True)
    return {"command": command, "started": started, "finished": finished,
            "elapsed_s": finished - started, "exit_code": code, "quick": quick}


def load_runs() -> dict[str, Any]:
    try:
        return dict(json.loads(RUNS.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def save_runs(runs: dict[str, Any]) -> None:
    RUNS.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
