"""The docs say each thing once, and what is generated stays generated."""

from __future__ import annotations

import re
import subprocess

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


def _layered_modules() -> set[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    return {name.strip() for layer in layers["layers"] for name in re.split(r"[|:]", layer)}


def test_every_module_is_on_the_map_and_under_its_contract() -> None:
    """docs/DESIGN.md §0 names every module, and the import-linter layers (`make lint`)
    place every one, so no module escapes the check that imports run downwards."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("## 0."):design.index("## 1.")]
    package = ROOT / "darkroom"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert sorted(m for m in modules if m not in section and f"{m}/" not in section) == []
    assert sorted(modules - _layered_modules()) == []
