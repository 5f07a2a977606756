"""Loads the named statements of the `.sql` files beside this module.

SQL lives in one folder: `queries.sql` holds the lease protocol (every status change),
the other files hold the statements of one concept each (keys, sweeper, ...).
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(package: str) -> dict[str, str]:
    """Every `-- name: x` statement of the `.sql` files in `package`, by name; a name
    defined twice is an error, so a statement is spelled in one place only."""
    queries: dict[str, str] = {}
    folder = resources.files(package)
    for file in sorted(folder.iterdir(), key=lambda f: f.name):
        if not file.name.endswith(".sql"):
            continue
        parts = _NAME.split(file.read_text(encoding="utf-8"))
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice (in {file.name})")
            queries[name] = body.strip()
    return queries


QUERIES: dict[str, str] = load("darkroom.db")
