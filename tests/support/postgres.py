"""A real PostgreSQL for the tests: darkroom's embedded one, or DARKROOM_TEST_DATABASE_URL.

Each test gets a database of its own, cloned from a migrated template, so no test can see
another's rows or depend on another's order. The clones are made one test ahead, and
dropped, by a thread of their own: a clone takes from 50 ms to half a second depending on
the disk, and that wait overlaps with the test before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from darkroom.db import embedded
from darkroom.db.migrations import migrate

TEMPLATE = "darkroom_test_template"


class TestPostgres:
    def __init__(self, server_url: str, pgdata: Path | None = None) -> None:
        self.server_url = server_url
        self.template_ready = False
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        self._spare: Future[str] | None = None
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
        """The clone made ahead, if it was made, and the next one started."""
        self.ensure_template()
        spare, self._spare = self._spare, self._maker.submit(self._create, True)
        if spare is not None:
            try:
                return spare.result()
            except psycopg.Error:
                pass  # made while a test restarted the server, say: make one now
        return self._create(True)

    @contextmanager
    def database(self, *, migrated: bool = True) -> Iterator[str]:
        name = self._migrated_clone() if migrated else self._create(False)
        try:
            yield self.url_for(name)
        finally:
            self._maker.submit(self._drop, name)

    def _close_maker(self) -> None:
        """Finish the pending drops, and drop the clone made ahead."""
        spare, self._spare = self._spare, None
        if spare is not None:
            self._maker.submit(lambda: self._drop(spare.result()))
        self._maker.shutdown(wait=True)

