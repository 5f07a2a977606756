"""The statements tests run against darkroom's tables where the product has none
(tests/support/queries.sql), loaded by name as darkroom.db.queries loads the product's.

A test that reads or pokes state names its statement here instead of spelling SQL, so a
schema change meets every test's statement in one file. The names never shadow a product
statement: a test that can use one uses it (darkroom.db.queries.QUERIES).
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

from darkroom.db.queries import QUERIES, load

SQL: dict[str, str] = load("tests.support")

_SHADOWED = SQL.keys() & QUERIES.keys()
if _SHADOWED:
    raise RuntimeError(f"test statements shadow the product's: {sorted(_SHADOWED)}")


class Attempt(NamedTuple):
    """One attempt known by its ids, for darkroom.layout's keys of an attempt
    (derived_key, thumb_key) when a test holds no Lease."""

    file_id: uuid.UUID
    token: uuid.UUID
