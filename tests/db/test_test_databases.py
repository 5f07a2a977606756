"""The tests' own databases: one made new after its test is as the template left it, a test
that changed more than rows never hands its database on, and a client a test left behind
cannot reach the next test's database (tests/support/postgres.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from darkroom.db.database import Database
from tests.support.postgres import TestPostgres
from tests.support.services import make_queue
from tests.support.sql import SQL


def oid_of(url: str) -> int:
    with psycopg.connect(url) as conn:
        found = conn.execute(SQL["database_oid"]).fetchone()
        assert found is not None
        return int(str(found[0]))


@contextmanager
def taken_again(postgres: TestPostgres, oid: int) -> Iterator[str | None]:
    """The database with `oid` when the next databases handed out include it (they are
    handed out oldest first), else None."""
    for _ in range(4):
        with postgres.database() as url:
            if oid_of(url) == oid:
                yield url
                return
    yield None


@pytest.fixture
def own(postgres: TestPostgres) -> TestPostgres:
    if postgres.pgdata is None:
        pytest.skip("an external server's databases are only ever made and dropped")
    return postgres


async def test_a_database_made_new_holds_what_its_template_held(own: TestPostgres) -> None:
    with own.database() as url, psycopg.connect(url, autocommit=True,
                                                row_factory=dict_row) as conn:
        before = conn.execute(SQL["fair_clock"]).fetchall()
        oid = oid_of(url)
        db = await Database.open(url, name="used")
        try:
            q = make_queue(db.pool)
            card = await q.create_file(owner="o", filename="a.jpg",
                                       content_type="image/jpeg", size=1)
            await q.confirm_card(card.id, "o", "v1")
            await q.claim(1)
        finally:
            await db.close()
        conn.execute(SQL["analyze_cards"])
    with taken_again(own, oid) as again:
        assert again is not None, "the database was not made new"
        with psycopg.connect(again, row_factory=dict_row) as conn:
            assert conn.execute(SQL["card_count"]).fetchone() == {"n": 0}
            assert conn.execute(SQL["event_count"]).fetchone() == {"n": 0}
            assert conn.execute(SQL["fair_clock"]).fetchall() == before
            assert conn.execute(SQL["statistics_count"]).fetchone() == {"n": 0}


def test_a_database_whose_schema_changed_is_never_handed_on(own: TestPostgres) -> None:
    with own.database() as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["add_later_columns"])
        oid = oid_of(url)
    with taken_again(own, oid) as again:
        assert again is None


def test_a_client_left_behind_cannot_reach_the_next_tests_database(
        own: TestPostgres) -> None:
    with own.database() as url:
        left: Any = psycopg.connect(url, autocommit=True)
        oid = oid_of(url)
    with taken_again(own, oid) as again:
        assert again is not None and again != url
        with pytest.raises(psycopg.OperationalError):
            left.execute(SQL["card_count"])
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url).close()
    left.close()
