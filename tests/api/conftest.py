"""A real API over real HTTP: uvicorn on a free loopback port in a background thread,
a fresh migrated database per test, and either the local store or SeaweedFS (S3)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from darkroom.api.app import create_app, server_config
from darkroom.config import Settings, load_settings
from darkroom.keys import create_key_at
from darkroom.storage import ObjectStore, open_store
from tests.support.browser import Chromium, chromium_binary
from tests.support.seaweed import SeaweedServer
from tests.support.services import free_port, wait_for

MAX_UPLOAD = 200_000


class ServerThread:
    """uvicorn in a thread of its own, with its own event loop, configured as
    `darkroom api` configures it (limits, protocol, connection cap)."""

    def __init__(self, app: Any, port: int) -> None:
        self.server = uvicorn.Server(server_config(app, host="127.0.0.1", port=port))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()

        def started() -> bool:
            if self.server.started:
                return True
            if not self.thread.is_alive():
                raise RuntimeError("the API did not start")
            return False

        wait_for(started, timeout=timeout, interval=0.01, what="the API to start")

    def stop(self) -> None:
        # As `darkroom api` does on SIGTERM: open event streams end, or shutdown waits.
        hub = getattr(getattr(self.server.config.app, "state", None), "hub", None)
        if hub is not None:
            hub.close_threadsafe()
        self.server.should_exit = True
        self.thread.join(15)


@dataclass
class Api:
    url: str
    settings: Settings
    store: ObjectStore
    db_url: str
    kind: str
    make_key: Callable[..., str]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def _storage_url(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    if kind == "local":
        return (tmp_path / "objects").as_uri()
    weed: SeaweedServer = request.getfixturevalue("seaweed")
    for name, value in weed.env().items():
        monkeypatch.setenv(name, value)
    bucket: str = request.getfixturevalue("shared_bucket")
    return f"s3://{bucket}/{uuid.uuid4().hex[:12]}"


def start_api(
    db_url: str,
    storage_url: str,
    tmp_path: Path,
    kind: str,
    store: ObjectStore | None = None,
    **overrides: Any,
) -> tuple[ServerThread, Api]:
    port = free_port()
    options: dict[str, Any] = {"max_upload_bytes": MAX_UPLOAD}
    options.update(overrides)
    settings = load_settings(
        database_url=db_url, storage_url=storage_url, data_dir=str(tmp_path / "data"), **options
    )
    store = store or open_store(storage_url)
    server = ServerThread(create_app(settings, store=store), port)
    server.start()

    def make_key(owner: str = "alice", admin: bool = False) -> str:
        return asyncio.run(create_key_at(db_url, owner, admin))

    return server, Api(server.url, settings, store, db_url, kind, make_key)


@pytest.fixture(params=["local", "s3"])
def api(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    """The API on each store in turn."""
    kind = str(request.param)
    server, api = start_api(
        db_url, _storage_url(kind, tmp_path, request, monkeypatch), tmp_path, kind
    )
    try:
        yield api
    finally:
        server.stop()


@pytest.fixture
def local_api(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    """The API on the local store only, for what does not depend on the store."""
    server, api = start_api(
        db_url, _storage_url("local", tmp_path, request, monkeypatch), tmp_path, "local"
    )
    try:
        yield api
    finally:
        server.stop()


@pytest.fixture
def page_api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    """The API with the default upload limit: the corpus photos are megabytes."""
    server, api = start_api(
        db_url, (tmp_path / "objects").as_uri(), tmp_path, "local", max_upload_bytes=25_000_000
    )
    try:
        yield api
    finally:
        server.stop()


@pytest.fixture
def worker_process(page_api: Api, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DARKROOM_DATABASE_URL": page_api.db_url,
        "DARKROOM_STORAGE_URL": page_api.settings.resolved_storage_url,
        "DARKROOM_DATA_DIR": str(tmp_path / "worker"),
        "DARKROOM_RETRY_BASE_SECONDS": "0",
        "DARKROOM_POLL_SECONDS": "0.5",
    }
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "darkroom.cli",
            "worker",
            "--concurrency",
            "2",
            "--name",
            "browser-test",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    """Headless Chromium driven by Playwright (the test is skipped, with its reason, where
    either is missing); closed after the test."""
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium binary found (apt-get install chromium)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    browser = Chromium(binary, playwright_api)
    try:
        yield browser
    finally:
        browser.close()
