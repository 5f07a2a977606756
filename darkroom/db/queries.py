"""Loads the named statements of `queries.sql` (one file, so SQL lives in one place)."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = resources.files("darkroom.db").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES: dict[str, str] = _load()
