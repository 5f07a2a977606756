"""The generated parts of the docs: README.md's settings table comes from `Settings`.

`make docs` (`python -m tests.docs_sync --write`) rewrites them; `tests/test_docs.py` fails
while a generated part differs from what the code would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

from darkroom.config import settings_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- settings: generated from darkroom/config.py by `make docs` -->"
END = "<!-- settings: end -->"


def with_table(text: str) -> str:
    """README's text with the settings table between its markers made anew."""
    head, begin, rest = text.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("README.md lacks the settings markers")
    return head + BEGIN + "\n" + settings_table() + END + tail


def main(argv: list[str]) -> int:
    text = README.read_text()
    fresh = with_table(text)
    if "--write" in argv:
        README.write_text(fresh)
        return 0
    return 0 if fresh == text else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
