"""Provenance: which JSON a figure comes from, the command and date that produced it, and
the machine it ran on (CPUs, CPU model, PostgreSQL version, load)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.cpu import cpu_model
from bench.runs import PY, Bench


def embedded_pg_version() -> str | None:
    """Version of the pgserver wheel's postgres, which every benchmark's private server is.

    Found without importing pgserver (its import warns and probes the runtime dir)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "pginstall" / "bin" / "postgres"
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+(?:\.\d+)+)", out)
    return m.group(1) if m else None


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M %Z")


@dataclass
class Source:
    """One benchmark's JSON and where it came from: what the doc and captions cite."""

    bench: Bench
    data: dict[str, Any] | None
    command: str | None
    date: str | None
    status: str  # one line for the summary table
    note: str | None = None  # shown at the top of the section when something is off
    machine: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, bench: Bench, data: dict[str, Any]) -> Source:
        """A result just measured, as its own script prints it."""
        return cls(bench, data, data.get("command"), when(time.time()), "this run",
                   machine=machine_of(bench, data, None))

    def short_command(self) -> str:
        command, _, comment = (self.command or "").partition("   #")
        return command + (" […]" if comment else "")

    def caption(self) -> str:
        m = self.machine
        parts = [f"{m.get('nproc', '?')} CPUs", str(m.get("cpu", "unknown CPU"))]
        if m.get("pg"):
            parts.append(f"PostgreSQL {m['pg']}")
        if m.get("load"):
            parts.append(f"load {m['load']}")
        parts.append(self.date or "date unknown")
        return " · ".join(parts)


def machine_of(bench: Bench, data: dict[str, Any], pg_now: str | None) -> dict[str, Any]:
    """CPUs, CPU model, PostgreSQL version and load, from the JSON where it says so.

    Each script records a different subset; what is missing is filled from this machine
    (the report runs where the benchmarks ran). derive.py uses no database at all."""
    m = data.get("machine") or {}
    out: dict[str, Any] = {
        "nproc": m.get("nproc") or m.get("cpus") or m.get("cores") or os.cpu_count(),
        "cpu": m.get("cpu") or cpu_model(),
    }
    pg = (data.get("postgres") or {}).get("server_version")
    if bench.name not in ("derive", "formats"):  # no database in these
        out["pg"] = pg or pg_now
    before = (m.get("loadavg_at_start") or m.get("loadavg_start")
              or m.get("load_average_before"))
    after = (data.get("loadavg_at_end") or m.get("loadavg_end")
             or m.get("load_average_after"))
    if before is not None and after is not None:
        out["load"] = f"{_one_minute(before):.1f}→{_one_minute(after):.1f}"
    return out


def _one_minute(load: Any) -> float:
    """Scripts record either os.getloadavg()'s triple or just its 1-minute figure."""
    return float(load[0] if isinstance(load, list | tuple) else load)



def source_for(bench: Bench, run: dict[str, Any] | None, this_run: bool, skipped: bool,
               pg_now: str | None) -> Source:
    """Read a benchmark's JSON and decide what the report may claim about it."""
    path = bench.json_path
    if not path.exists():
        why = ("script not written yet" if not bench.script.exists()
               else "skipped (--skip)" if skipped
               else f"run failed (exit {run['exit_code']}), see bench/out/{bench.name}.log"
               if this_run and run else "no JSON yet")
        return Source(bench, None, None, None, f"no figures: {why}",
                      note=f"No figures: `bench/out/{bench.name}.json` does not exist ({why}).")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return Source(bench, None, None, None, "unreadable JSON",
                      note=f"`bench/out/{bench.name}.json` is not valid JSON ({exc}).")
    mtime = path.stat().st_mtime
    note = None
    # A run record describes this JSON only if the JSON was written during that run; a
    # JSON rewritten by hand later must not be credited to the report's command.
    credited = (run is not None and run["started"] - 1 <= mtime <= run["finished"] + 5)
    if credited and run is not None:
        command, date = run["command"], when(run["finished"])
        status = (f"rerun in this report run ({date}, {run['elapsed_s']:.0f} s)" if this_run
                  else f"from the report run of {date}")
        if run.get("quick"):
            note = "Quick (smoke-test) sizes: not the published figures."
    else:
        command = data.get("command") or reconstruct_command(bench.name, data)
        date = when(mtime)
        status = f"from bench/out/{bench.name}.json of {date}"
        if this_run and run is not None:
            note = (f"The rerun failed (exit {run['exit_code']}, see "
                    f"`bench/out/{bench.name}.log`); these figures are from the previous "
                    f"JSON of {date}.")
            status = f"rerun FAILED; {status}"
        elif skipped:
            status = f"not rerun (--skip); {status}"
    if (data.get("plan") or {}).get("quick"):
        note = "Quick (smoke-test) sizes: not the published figures."
    return Source(bench, data, command, date, status, note=note,
                  machine=machine_of(bench, data, pg_now))


def reconstruct_command(name: str, data: dict[str, Any]) -> str:
    """The command line, rebuilt from the options a JSON records when it does not record
    its command; what cannot be recovered is said in a trailing comment."""
    base = [PY, "-m", f"bench.{name}"]
    plan = data.get("plan") or {}
    args: list[str] = []
    unknown = ""
    if name == "derive" and data.get("rounds") is not None:
        args = ["--rounds", str(data["rounds"])]
        unknown = "--corpus/--big not recorded (defaults assumed)"
    elif name == "worker":
        samples = (data.get("latency_ms") or {}).get("samples")
        args = ["--latency-samples", str(samples)] if samples else []
        unknown = "--images not recorded"
    elif name == "api" and plan:
        for key in ("rate", "seconds", "warmup_seconds", "ceiling_seconds", "ceiling_cards",
                    "connections", "backlog", "worker_nice"):
            if plan.get(key) is not None:
                v = plan[key]
                args += [f"--{key.replace('_', '-')}",
                         f"{v:g}" if isinstance(v, float) else str(v)]
        if plan.get("clients"):
            args += ["--clients", *map(str, plan["clients"])]
    elif name == "soak" and data.get("target") is not None:
        args = ["--images", str(data["target"]), "--rate", f"{data.get('rate', 150):g}"]
        unknown = "--sample not recorded"
    else:
        unknown = "options not recorded (defaults assumed)"
    command = shlex.join(base + args)
    return command + (f"   # {unknown}" if unknown else "")

