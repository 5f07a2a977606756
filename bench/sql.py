"""The statements benches run where neither the product nor the tests have one
(bench/queries.sql, and the fair-share rule before migration 0012 in
bench/fair_previous.sql), loaded by name as darkroom.db.queries loads the product's.

A bench spells no SQL of its own, as a test does not (tests/test_docs.py): it uses the
product's statement where there is one (darkroom.db.queries.QUERIES), the tests' where
one is exactly what it needs (tests.support.sql.SQL), and names its own here otherwise.
The names never shadow either, so a name means one statement wherever it is read.
"""

from __future__ import annotations

from psycopg import sql

from darkroom.db.queries import QUERIES, load
from tests.support.sql import SQL as TEST_SQL

SQL: dict[str, str] = load("bench")

_SHADOWED = SQL.keys() & (QUERIES.keys() | TEST_SQL.keys())
if _SHADOWED:
    raise RuntimeError(f"bench statements shadow the product's or the tests': "
                       f"{sorted(_SHADOWED)}")


def composed(statement: str, /, **identifiers: str) -> sql.Composed:
    """Named `statement` with each {placeholder} filled by an identifier, quoted: the
    name of a database or a channel, which CREATE DATABASE, LISTEN and the like take
    where a parameter cannot go."""
    return sql.SQL(SQL[statement]).format(
        **{k: sql.Identifier(v) for k, v in identifiers.items()})
