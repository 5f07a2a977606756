"""A real PostgreSQL for the tests: darkroom's embedded one, or DARKROOM_TEST_DATABASE_URL.

Each test gets a database of its own, as its migrated template left it, so no test can see
another's rows or depend on another's order. On darkroom's own server a finished test's
database is made new again instead of dropped (`_recycle`): cut off, renamed, emptied,
given back the template's rows, and checked against the template's schema; any
difference, and it is dropped and a clone made in its place. A clone costs the server
about 240 ms of CPU (copying the template's files, two checkpoints, the drop), which made
a quarter of the fast lane's CPU; the recycling, a tenth of that. Both run on a thread of
their own, overlapping with the next test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from darkroom.db import embedded
from darkroom.db.migrations import migrate
from tests.support.sql import SQL

TEMPLATE = "darkroom_test_template"


class TestPostgres:
    __test__ = False  # a helper, not a test class, wherever a test module imports it

    def __init__(self, server_url: str, pgdata: Path | None = None) -> None:
        self.server_url = server_url
        self.template_ready = False
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        # Databases on their way to be as the template left them, oldest first.
        self._ready: deque[Future[str]] = deque()
        self._template: _Template | None = None
        self.pgdata = pgdata  # set when the server is our own, so it can be restarted

    @classmethod
    def start(cls, tmp: Path) -> TestPostgres:
        url = os.environ.get("DARKROOM_TEST_DATABASE_URL")
        if url:
            return cls(url)
        # Not under pytest's tmp dirs: those are private to root, and the server runs as
        # the unprivileged `darkroom` user when the tests run as root (mkdtemp's 0700
        # directory becomes its data dir, handed to that user; /tmp lets it in).
        base = Path(tempfile.mkdtemp(prefix="darkroom-test-pg-"))
        pgdata = base / "pg"
        return cls(embedded.url(pgdata, stop_on_exit=True), pgdata)

    def skip_flushes(self) -> None:
        """For the tests' own server, no flushes to disk: every test creates a database
        and commits often, and on a shared disk the flushes are most of that time. A
        commit is still written to the server's log before it is acknowledged
        (synchronous_commit stays on), so a killed or restarted server loses nothing; only
        a machine crash could, and the files are deleted after the run anyway. An external
        server is left as it is."""
        if self.pgdata is None:
            return
        with self._admin() as conn:
            for setting in ("fsync", "full_page_writes"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("SELECT pg_reload_conf()")

    def restart(self) -> None:
        """Restart the server under its clients (fast shutdown: every session is cut)."""
        assert self.pgdata is not None, "only the embedded server can be restarted"
        # Its log where the start put it: without one, the new postmaster keeps pg_ctl's
        # output pipe open and pg_ctl never seems to finish.
        self._pg_ctl("restart", "-l", str(self.pgdata / "log"))

    def stop(self) -> None:
        """Stop our own server and delete its files; an external server is left alone.

        Explicitly, at the end of the session, with the server's files: nothing else
        would stop it (a `restart` gives it a new postmaster), and it would outlive the
        tests.
        """
        self._close_maker()
        if self.pgdata is None:
            return
        self._pg_ctl("stop", check=False)
        shutil.rmtree(self.pgdata.parent, ignore_errors=True)

    def _pg_ctl(self, action: str, *extra: str, check: bool = True) -> None:
        assert self.pgdata is not None
        embedded.pg_ctl(self.pgdata, "-w", "-m", "fast", *extra, action, check=check,
                        timeout=60)

    def url_for(self, dbname: str) -> str:
        params = conninfo_to_dict(self.server_url)
        params["dbname"] = dbname
        return make_conninfo(**params)  # type: ignore[arg-type]

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.server_url, autocommit=True)

    def ensure_template(self) -> None:
        if self.template_ready:
            return
        with self._admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {TEMPLATE}")
        migrate(self.url_for(TEMPLATE))
        with psycopg.connect(self.url_for(TEMPLATE), autocommit=True) as conn:
            self._template = _Template.read(conn)
        self.template_ready = True

    def _create(self, migrated: bool) -> str:
        name = f"darkroom_t_{uuid.uuid4().hex[:12]}"
        with self._admin() as conn:
            template = f" TEMPLATE {TEMPLATE}" if migrated else ""
            if migrated and self.pgdata is not None:
                # Our own server (16, flushes off): copying the template's files is about
                # twice as fast as logging every block of them (the default since 15).
                template += " STRATEGY FILE_COPY"
            conn.execute(f"CREATE DATABASE {name}{template}")
        return name

    def _drop(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _migrated_clone(self) -> str:
        """A database as the template left it: one made new since its test, else a clone."""
        self.ensure_template()
        while self._ready:
            try:
                return self._ready.popleft().result()
            except psycopg.Error:
                pass  # made new while a test restarted the server, say: take the next
        return self._create(True)

    def _recycle(self, name: str) -> str:
        """`name`, a finished test's database, as the template left it, under a new name;
        or, when that cannot be done or the test changed more than rows, a new clone."""
        template = self._template
        assert template is not None
        fresh = f"darkroom_t_{uuid.uuid4().hex[:12]}"
        try:
            with self._admin() as conn:
                # Cut off every session still on it, then rename it: a client the test
                # left behind that connects again finds no database by its old name,
                # rather than the next test's rows.
                conn.execute(SQL["terminate_sessions"], {"name": name})
                conn.execute(f"ALTER DATABASE {name} RENAME TO {fresh}")
        except psycopg.Error:
            self._drop(name)
            return self._create(True)
        try:
            with psycopg.connect(self.url_for(fresh), autocommit=True) as conn:
                template.restore(conn)
                same = template.schema == _Template.fingerprint(conn)
        except psycopg.Error:
            same = False
        if same:
            return fresh
        self._drop(fresh)
        return self._create(True)

    @contextmanager
    def database(self, *, migrated: bool = True) -> Iterator[str]:
        name = self._migrated_clone() if migrated else self._create(False)
        try:
            yield self.url_for(name)
        finally:
            if migrated and self.pgdata is not None:
                self._ready.append(self._maker.submit(self._recycle, name))
            else:  # an external server's databases are only ever made and dropped
                self._maker.submit(self._drop, name)

    def _close_maker(self) -> None:
        """Finish the pending work, and drop the databases kept for the next tests."""
        while self._ready:
            self._maker.submit(self._drop_when_made, self._ready.popleft())
        self._maker.shutdown(wait=True)

    def _drop_when_made(self, made: Future[str]) -> None:
        with contextlib.suppress(psycopg.Error):  # never made: nothing to drop
            self._drop(made.result())


class _Template:
    """What a test database must hold to be as the migrated template left it: the rows of
    each table (the migrations' own, such as the fair clock's one row), the state of each
    sequence, and its schema's fingerprint."""

    def __init__(self, rows: dict[str, tuple[list[str], list[tuple[object, ...]]]],
                 sequences: dict[str, tuple[int, bool]], schema: str) -> None:
        self.rows, self.sequences, self.schema = rows, sequences, schema

    @classmethod
    def read(cls, conn: psycopg.Connection[tuple[object, ...]]) -> _Template:
        rows: dict[str, tuple[list[str], list[tuple[object, ...]]]] = {}
        for (table,) in conn.execute(SQL["own_tables"]).fetchall():
            cur = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(str(table))))
            rows[str(table)] = ([c.name for c in cur.description or ()], cur.fetchall())
        sequences: dict[str, tuple[int, bool]] = {}
        for (seq,) in conn.execute(SQL["own_sequences"]).fetchall():
            found = conn.execute(sql.SQL("SELECT last_value, is_called FROM {}")
                                 .format(sql.Identifier(str(seq)))).fetchone()
            assert found is not None
            sequences[str(seq)] = (int(str(found[0])), bool(found[1]))
        return cls(rows, sequences, cls.fingerprint(conn))

    @staticmethod
    def fingerprint(conn: psycopg.Connection[tuple[object, ...]]) -> str:
        found = conn.execute(SQL["schema_fingerprint"]).fetchone()
        assert found is not None
        return str(found[0])

    def restore(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Empty every table, give back the template's rows, sequences and statistics
        (none: a clone has never been analysed), in one transaction."""
        with conn.transaction():
            # Only the tables that hold anything on disk: one a test never wrote is as the
            # clone had it, and emptying a table costs new files for it and its indexes.
            written = [str(t) for (t,) in conn.execute(SQL["own_tables_written"]).fetchall()]
            if written:
                conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE")
                             .format(sql.SQL(", ").join(map(sql.Identifier, written))))
            conn.execute(SQL["forget_statistics"])
            for table, (columns, values) in self.rows.items():
                # Emptied just now (written, or by the cascade of a table it refers to).
                if not values or conn.execute(
                        sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(table))
                ).fetchone():
                    continue
                insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)),
                    sql.SQL(", ").join(sql.Placeholder() * len(columns)))
                with conn.cursor() as cur:
                    cur.executemany(insert, values)
            for seq, (last, called) in self.sequences.items():
                conn.execute(SQL["set_sequence"], {"seq": seq, "last": last, "called": called})
