"""The tests' own statements (tests/support/queries.sql) run against the migrated schema,
so a migration that renames what one reads fails here, in the fast lane, rather than in
the fleet test that uses it."""

from __future__ import annotations

import re

import psycopg

from tests.support.sql import SQL

_PARAM = re.compile(r"%\((\w+)\)s")


def test_each_statement_runs_on_the_schema(db_url: str) -> None:
    failed = {}
    with psycopg.connect(db_url) as conn, conn.transaction(force_rollback=True):
        for name, statement in sorted(SQL.items()):
            try:
                with conn.transaction():  # a savepoint: one statement's error is its own
                    conn.execute(statement, dict.fromkeys(_PARAM.findall(statement)))
            except psycopg.errors.IntegrityError:
                pass  # planned and run: a NULL parameter may break a constraint
            except psycopg.Error as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
    assert failed == {}
