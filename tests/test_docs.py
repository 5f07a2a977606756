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
