"""The docs say each thing once, and what is generated stays generated."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from darkroom.config import Settings
from tests.docs_sync import README, ROOT, with_table


def test_readme_settings_table_is_made_from_settings() -> None:
    text = README.read_text()
    assert with_table(text) == text, "README.md's settings table is stale: run `make docs`"


def test_every_setting_is_in_the_readme() -> None:
    text = README.read_text()
    missing = [name for name in Settings.model_fields
               if name != "schema_ready" and f"`DARKROOM_{name.upper()}`" not in text]
    assert missing == []


def test_nothing_reads_outside_the_repository() -> None:
    """A clone with nothing beside it runs the tests and the benchmarks."""
    files = subprocess.run(["git", "ls-files", "*.py", "Makefile", ".ci/run", "*.toml"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"\.\./shared|parent / \"shared\"|parents\[\d\] / \"shared\"")
    offenders = [f for f in files if f != "tests/test_docs.py"
                 and outside.search((ROOT / f).read_text(errors="replace"))]
    assert offenders == []


def _contract(contract_id: str) -> dict[str, Any]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: dict[str, Any] = next(c for c in config["tool"]["importlinter"]["contracts"]
                                 if c["id"] == contract_id)
    return found


def _layered_modules(contract_id: str = "layers") -> set[str]:
    layers = _contract(contract_id)
    return {name.strip() for layer in layers["layers"] for name in re.split(r"[|:]", layer)}


def _modules(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").exists()}


def test_every_module_is_on_the_map_and_under_its_contract() -> None:
    """docs/DESIGN.md §0 names every module, and the import-linter layers (`make lint`)
    place every one, so no module escapes the check that imports run downwards."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("## 0."):design.index("## 1.")]
    modules = _modules(ROOT / "darkroom")
    assert sorted(m for m in modules if m not in section and f"{m}/" not in section) == []
    assert sorted(modules - _layered_modules()) == []


def test_every_api_module_is_on_the_map_and_under_its_contracts() -> None:
    """Inside `api/` too: §0's entry names every module and every route module, the `api`
    layers place every module, and `api-routes` keeps every route module apart from the
    others (routes per resource)."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("## 0."):design.index("## 1.")]
    entry = section[section.index("  api/"):section.index("  worker.py")]
    package = ROOT / "darkroom" / "api"
    modules = _modules(package)
    routes = _modules(package / "routes")
    assert sorted(m for m in modules | routes
                  if f"{m}.py" not in entry and f"{m}/" not in entry) == []
    assert sorted(modules - _layered_modules("api")) == []
    assert sorted(f"darkroom.api.routes.{m}" for m in routes) == sorted(
        _contract("api-routes")["modules"])


def test_benchmarks_blocks_are_the_reports() -> None:
    """docs/BENCHMARKS.md's figures are generated blocks: each marked block is one that
    bench/report.py writes (for a benchmark it knows, with its banner) or that a benchmark
    script splices in itself (bench/fleet.py, bench/failover.py), and every benchmark
    report.py renders has its block in its own section, so rerunning the benchmarks
    rewrites every figure and nothing else."""
    from bench.runs import BY_NAME
    from bench.sections import RENDERERS
    from bench.splice import DOC, END, START, block

    doc = DOC.read_text(encoding="utf-8")
    names = re.findall(r"<!-- report:(\w+):start -->", doc)
    assert len(names) == len(set(names)), names
    own = {n for n in names if n != "intro" and n not in BY_NAME}
    for name in own:
        script = ROOT / "bench" / f"{name}.py"
        assert script.exists() and f'"{name}"' in script.read_text(), name
        assert "splice(" in script.read_text(), name
    banner = block("x", []).splitlines()[1]
    for name in set(names) - own:
        start = doc.index(START.format(name))
        end = doc.index(END.format(name), start)
        assert doc[start:end].splitlines()[1] == banner, name
    for name in RENDERERS:
        heading = re.search(rf"^## .*\(bench/{name}\.py\)$", doc, re.M)
        assert heading is not None and name in names, name
        assert doc.index(START.format(name)) > heading.start(), name


def test_benchmarks_keep_no_diary() -> None:
    """Hand-written notes explain a figure; the history of how it came to be is git's."""
    from bench.splice import DOC

    assert re.findall(r"\b[Ii]ssue \d+", DOC.read_text(encoding="utf-8")) == []


def _benchmarks_notes() -> str:
    """docs/BENCHMARKS.md without its marked blocks: the hand-written text alone."""
    from bench.splice import DOC

    doc = DOC.read_text(encoding="utf-8")
    return re.sub(r"<!-- report:(\w+):start -->.*?<!-- report:\1:end -->", "", doc,
                  flags=re.S)


def test_benchmarks_notes_carry_no_dates_or_commits() -> None:
    """A generated block carries its run's date and machine; a hand-written note that
    names a date, a time of day or a commit is about a run the document no longer shows
    (or about how the figure came to be), so it goes stale the next time the benchmarks
    run. Notes say how a figure is measured and what it means; git keeps the history."""
    notes = _benchmarks_notes()
    assert "<!-- report:" not in notes
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", notes) == []
    assert re.findall(r"\b\d\d:\d\d UTC\b", notes) == []
    assert re.findall(r"\(([0-9a-f]{7,40})\b", notes) == []


# The tests of the database layer itself (servers, connections, failover) and the
# fixtures that run PostgreSQL speak to the server, not to darkroom's tables.
_SERVER_SQL = {"tests/db/test_connection.py", "tests/db/test_database.py",
               "tests/db/test_embedded.py", "tests/db/test_failover.py",
               "tests/support/postgres.py", "tests/support/replica.py"}


def test_tests_and_benches_spell_no_sql_of_their_own() -> None:
    """A test or a bench reads or pokes darkroom's tables (and a bench the server and the
    peers it is compared with) only through a named statement: the product's
    (darkroom/db/*.sql), the tests' (tests/support/queries.sql) or the benches'
    (bench/queries.sql, bench/fair_previous.sql). No bench is excepted: one that speaks to
    the server names that statement too (bench/sql.py `composed` quotes a database's or a
    channel's name in), and bench.queue_split's --variant runs SQL from its command line."""
    inline = re.compile(r"\.execute\(\s*f?[\"'](SELECT|UPDATE|INSERT|DELETE|TRUNCATE|WITH"
                        r"|ALTER|CREATE|DROP)\b", re.IGNORECASE)
    files = subprocess.run(["git", "ls-files", "tests/*.py", "bench/*.py"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    assert any(f.startswith("bench/") for f in files)
    offenders = [f for f in files if f not in _SERVER_SQL
                 and inline.search((ROOT / f).read_text(errors="replace"))]
    assert offenders == []
