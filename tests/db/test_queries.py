"""The named statements as the server gets them."""

from __future__ import annotations

from darkroom.db.queries import QUERIES, compact


def test_comments_and_runs_of_white_space_never_reach_the_server() -> None:
    sql = ("SELECT 'a -- b''  c' AS \"x  -- y\", $$ -- kept  $$, $f$ --  $f$ -- gone\n"
           "    FROM t  -- gone too\n\n  WHERE n = 1-2 AND m = a - -1 AND %(p)s IS NULL")
    assert compact(sql) == (
        "SELECT 'a -- b''  c' AS \"x  -- y\", $$ -- kept  $$, $f$ --  $f$ FROM t "
        "WHERE n = 1-2 AND m = a - -1 AND %(p)s IS NULL")


def test_the_protocols_statements_are_sent_without_their_comments() -> None:
    for name, sql in QUERIES.items():
        assert "\n" not in sql and "  " not in sql, name
    # The driver parses a text under 4 KiB once; the fenced commit's two are.
    assert len(QUERIES["publish"]) < 4096 and len(QUERIES["complete"]) < 4096
