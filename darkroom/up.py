"""`darkroom up`: the whole service on one machine, in one command.

It starts (or joins) the embedded PostgreSQL, applies migrations, and runs the API, one
worker and the sweeper as child processes, the same processes an operator would run on
separate hosts. It prints the URL and an API key for the local owner, restarts a child
that dies, and on Ctrl-C or SIGTERM stops every child gracefully, then the database.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from darkroom import logs
from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.migrations import migrate
from darkroom.keys import create_key, find_key
from darkroom.services import SCHEMA_READY_ENV
from darkroom.storage.local import private_dir, write_private

LOCAL_OWNER = "local"
_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    # A session of its own, so a terminal's Ctrl-C reaches only `up`, which then sends
    # each child exactly one SIGTERM (a second signal would skip the worker's grace);
    # and a SIGTERM from the kernel should `up` itself die without cleaning up.
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "darkroom.cli", *self.args],
                                     env=env, preexec_fn=_child_setup)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _local_key(settings: Settings, conninfo: str) -> str:
    """The local owner's admin key, kept in the data dir so every `up` shows the same one."""
    path = settings.data_path / "local-api-key"

    async def ensure() -> str:
        from darkroom.db.database import opened

        async with opened(conninfo, name="up") as db:
            if path.exists():
                known = path.read_text().strip()
                if await find_key(db, known) is not None:
                    return known
            key = await create_key(db, LOCAL_OWNER, admin=True)
        write_private(path, (key + "\n").encode())
        return key

    return asyncio.run(ensure())


def _wait_healthy(url: str, api: Child, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not api.running():
            raise ConfigError("the API process exited at start; see the log above")
        try:
            with urllib.request.urlopen(f"{url}healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise ConfigError(f"the API did not answer at {url} within {timeout:.0f} s")


def main(settings: Settings, *, host: str, port: int, workers: int | None) -> int:
    logs.setup()
    embedded = None
    if settings.database_url is None:
        from darkroom.db import embedded as embedded_db

        # It makes the data dir private itself, after every check of its own.
        embedded = embedded_db.start(settings.data_path / "pg", stop_on_exit=True)
        conninfo = str(embedded.get_uri())
    else:
        private_dir(settings.data_path)
        conninfo = database_url(settings)
    migrate(conninfo)
    key = _local_key(settings, conninfo)

    env = {
        **os.environ,
        "DARKROOM_DATABASE_URL": conninfo,
        "DARKROOM_STORAGE_URL": settings.resolved_storage_url,
        "DARKROOM_DATA_DIR": str(settings.data_path),
        SCHEMA_READY_ENV: "1",  # migrated just above: the children need not again
    }
    slots = workers or os.cpu_count() or 1
    children = [
        Child("api", ["api", "--host", host, "--port", str(port)]),
        Child("worker", ["worker", "--concurrency", str(slots), "--name", "local-worker"]),
        Child("sweeper", ["sweep"]),
    ]
    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    for child in children:
        child.start(env)
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown_host}:{port}/"
    try:
        _wait_healthy(url, children[0])
        print(f"\ndarkroom is up: {url}\nAPI key (owner {LOCAL_OWNER!r}, admin): {key}\n"
              f"data: {settings.data_path}\nCtrl-C stops everything.\n", flush=True)
        while not stop:
            time.sleep(0.2)
            for child in children:
                if not child.running() and not stop:
                    _restart(child, env)
    finally:
        _stop_all(children, settings.shutdown_grace_seconds + 10)
        if embedded is not None:
            embedded.cleanup()
    print("darkroom stopped.", flush=True)
    return 0


def _restart(child: Child, env: dict[str, str]) -> None:
    now = time.monotonic()
    child.restarts = [t for t in child.restarts if now - t < 60] + [now]
    if len(child.restarts) > 5:
        raise ConfigError(f"the {child.name} process keeps exiting; stopping")
    code = child.proc.returncode if child.proc else None
    print(f"darkroom up: {child.name} exited ({code}); restarting", file=sys.stderr)
    child.start(env)


def _stop_all(children: list[Child], timeout: float) -> None:
    for child in children:
        if child.running() and child.proc is not None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        if child.proc is None:
            continue
        try:
            child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()

