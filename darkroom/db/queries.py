"""Loads the named statements of the `.sql` files beside this module.

SQL lives in one folder: `queries.sql` holds the lease protocol (every status change),
the other files hold the statements of one concept each (keys, sweeper, ...).
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# What a statement is made of, for `compact`: quoted text and dollar-quoted bodies (kept
# as they are), comments, runs of white space, and anything else.
_TOKEN = re.compile(r"""
      (?P<quoted> '(?:[^']|'')*' | "(?:[^"]|"")*" )
    | (?P<dollar> (?P<tag>\$[A-Za-z_]*\$) .*? (?P=tag) )
    | (?P<comment> --[^\n]* )
    | (?P<space> \s+ )
    | [^'"$\s-]+ | .
    """, re.VERBOSE | re.DOTALL)


def compact(sql: str) -> str:
    """`sql` without its comments and with each run of white space one space: what the
    server needs, about half of what a reader needs. A statement's text is sent, and
    parsed by the driver for its parameters, at every execution (the driver keeps its
    parse only for texts under 4 KiB), so the comments that explain the protocol would cost
    every job."""
    parts: list[str] = []
    gap = False  # a comment or white space since the last part kept
    for m in _TOKEN.finditer(sql):
        if m.group("comment") is not None or m.group("space") is not None:
            gap = True
            continue
        if gap and parts:
            parts.append(" ")
        gap = False
        parts.append(m.group(0))
    return "".join(parts)


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
            queries[name] = compact(body)
    return queries


QUERIES: dict[str, str] = load("darkroom.db")
