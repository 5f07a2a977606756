"""What a migration does to a database that held a previous release, against a new one."""

from __future__ import annotations

import psycopg

from darkroom.db.migrations import available, migrate
from tests.support.sql import SQL


def _held_a_release_up_to(db_url: str, last: str) -> None:
    """The schema up to migration `last`, applied a while ago."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["migrations_table"])
        for name, sql in available():
            if name > last:
                break
            conn.execute(sql.encode())
            conn.execute(SQL["migration_applied_a_while_ago"], {"name": name})


def test_cards_are_notified_for_an_hour_after_an_upgrade_and_not_on_a_new_database(
        empty_db_url: str, db_url: str) -> None:
    """The previous release's API processes never announce that they listen (migration
    0022): an upgraded database notifies regardless while a rolling deploy replaces them."""
    _held_a_release_up_to(empty_db_url, "0021_fair_heads")
    assert migrate(empty_db_url) == ["0022_cards_listened"]
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute(SQL["announce_holds_for"]).fetchone() == (True, True)
    with psycopg.connect(db_url) as conn:  # migrated new, in one go
        assert conn.execute(SQL["announce_holds_for"]).fetchone() == (False, False)
