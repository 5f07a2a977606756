"""A primary and a streaming standby made from the embedded PostgreSQL's own binaries
(the pgserver wheel's bin dir): `initdb`, `pg_basebackup -R`, `pg_ctl promote`.

The pair is what a managed service or an operator (CloudNativePG, Patroni) runs: clients
name both hosts with `target_session_attrs=read-write` and follow whichever is primary.
`link.stall()` stops the stream (the standby falls behind); `kill_primary` is a machine
loss (`kill -9` of the postmaster and of every backend, so no shutdown checkpoint, no
goodbye to the standby); `promote` is the operator's failover.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from darkroom.db import embedded
from darkroom.db.migrations import migrate
from tests.support.faults import FaultProxy
from tests.support.services import free_port, wait_for

STANDBY_NAME = "standby1"


def _bin(name: str) -> str:
    return embedded.binary(name)


class ReplicatedPostgres:
    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        # Not under pytest's tmp dirs: those are private to root, and the servers run as
        # the embedded database's unprivileged user when the tests run as root.
        self.base = Path(tempfile.mkdtemp(prefix="darkroom-failover-"))
        self.base.chmod(0o755)
        account = embedded.service_account()  # made on first use, as `darkroom up` does
        self.user = account.name if account else None
        self.primary_dir = self.base / "primary"
        self.standby_dir = self.base / "standby"
        self.ports = (free_port(), free_port())
        self.promoted = False
        # The standby streams through a proxy, so that the link can stall as a congested
        # or partitioned network does: the standby falls behind, the primary goes on.
        self.link = FaultProxy(("127.0.0.1", self.ports[0]))
        self._start()

    # --- addresses ---------------------------------------------------------------------

    def host_url(self, index: int, dbname: str = "darkroom") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[index]}/{dbname}"

    @property
    def url(self) -> str:
        """What every darkroom process is given: both hosts, the writable one wanted."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"postgresql://postgres@{hosts}/darkroom?target_session_attrs=read-write"

    @property
    def primary_url(self) -> str:
        return self.host_url(1 if self.promoted else 0)

    # --- life --------------------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run(list(args), check=True, user=self.user, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.base)

    def _start(self) -> None:
        if self.user:
            shutil.chown(self.base, self.user, self.user)
        self._run(_bin("initdb"), "-D", str(self.primary_dir), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8")
        conf = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.base}'",
            "wal_level = replica", "max_wal_senders = 5", "wal_keep_size = '512MB'",
            "hot_standby = on",
            # Flushes are not what is tried here: a killed server keeps what the kernel
            # holds, so each side loses only what never reached it.
            "fsync = off", "full_page_writes = off",
            "synchronous_commit = on",
            "max_connections = 200",
        ]
        with (self.primary_dir / "postgresql.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        self._pg_ctl(self.primary_dir, "start", port=self.ports[0])
        with psycopg.connect(self.host_url(0, "postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE darkroom")
        migrate(self.host_url(0))
        self._run(_bin("pg_basebackup"), "-D", str(self.standby_dir), "-R", "-X", "stream",
                  "-c", "fast",
                  "-d", f"host=127.0.0.1 port={self.link.port} user=postgres"
                        f" application_name={STANDBY_NAME}")
        self._pg_ctl(self.standby_dir, "start", port=self.ports[1])
        if self.synchronous:
            # Only once the standby is there: until then every commit would wait for it.
            with psycopg.connect(self.host_url(0, "postgres"), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
        wait_for(self._streaming, timeout=60, what="the standby to stream")

    def _pg_ctl(self, pgdata: Path, action: str, *, port: int | None = None) -> None:
        args = [_bin("pg_ctl"), "-D", str(pgdata), "-w", "-t", "60", "-l",
                str(pgdata.parent / f"{pgdata.name}.log"), action]
        if port is not None:
            args += ["-o", f"-p {port}"]
        self._run(*args)

    def _streaming(self) -> bool:
        with psycopg.connect(self.host_url(0, "postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication"
                               " WHERE application_name = %s", (STANDBY_NAME,)).fetchone()
        want = "sync" if self.synchronous else "async"
        return row is not None and row[0] == want

    def kill_primary(self) -> None:
        """A lost machine: the postmaster and every backend killed at once."""
        pid = int((self.primary_dir / "postmaster.pid").read_text().split()[0])
        children = [int(p) for p in os.listdir("/proc") if p.isdigit()
                    and _ppid(int(p)) == pid]
        for victim in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), timeout=30, what="the primary to die")

    def promote(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.standby_dir), "-w", "-t", "60", "promote")
        self.promoted = True

    def stop(self) -> None:
        self.link.close()
        for pgdata in (self.primary_dir, self.standby_dir):
            if (pgdata / "postmaster.pid").exists():
                subprocess.run([_bin("pg_ctl"), "-D", str(pgdata), "-m", "immediate",
                                "-w", "stop"], user=self.user, timeout=60, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.base, ignore_errors=True)


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

