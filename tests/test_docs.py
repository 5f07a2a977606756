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
