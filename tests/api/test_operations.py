"""Faults, keys and the `darkroom api` process: what an operator meets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from darkroom.errors import StorageUnavailable
from darkroom.keys import hash_key
from darkroom.storage import LocalStore, ObjectStore
from tests.api.conftest import Api, start_api
from tests.api.helpers import JPEG, assert_problem, create, upload
from tests.support.services import free_port, wait_for
from tests.support.sql import SQL


class FaultyStore:
    """A local store whose chosen methods fail the way a real outage (or bug) would."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.failing: dict[str, BaseException] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self.failing:
                raise self.failing[name]
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def faulty(db_url: str, tmp_path: Path) -> Iterator[tuple[Api, FaultyStore]]:
    store = FaultyStore(LocalStore(tmp_path / "objects"))
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local", store=store)
    try:
        yield api, store
    finally:
        server.stop()


def test_store_outage_is_503_and_readyz_says_so(faulty: tuple[Api, FaultyStore]) -> None:
    api, store = faulty
    with api.client(api.make_key()) as c:
        card, version = upload(c)
        store.failing = {
            name: StorageUnavailable("s3 at http://secret:9000 timed out")
            for name in ("put", "head", "check", "presign_put")
        }
        r = c.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
        body = assert_problem(r, 503, "storage_unavailable")
        assert "secret" not in r.text and r.headers["retry-after"]
        assert body["detail"]
        assert_problem(c.put(f"/v1/files/{card['id']}/content", content=JPEG), 503)
        assert_problem(create(c), 503, "storage_unavailable")
        ready = httpx.get(f"{api.url}/readyz")
        assert_problem(ready, 503, "not_ready_to_serve")
        assert ready.json()["checks"] == {"database": "ok", "storage": "unavailable"}
        assert httpx.get(f"{api.url}/healthz").status_code == 200  # liveness does no I/O

        store.failing = {}
        assert (
            c.post(f"/v1/files/{card['id']}/confirm", json={"version": version}).status_code == 202
        )
        assert httpx.get(f"{api.url}/readyz").status_code == 200


def test_a_repeat_confirm_needs_no_store(faulty: tuple[Api, FaultyStore]) -> None:
    api, store = faulty
    with api.client(api.make_key()) as c:
        card, version = upload(c)
        url = f"/v1/files/{card['id']}/confirm"
        first = c.post(url, json={"version": version})
        assert first.status_code == 202
        store.failing = {"head": StorageUnavailable("s3 at http://secret:9000 timed out")}
        again = c.post(url, json={"version": version})
        assert again.status_code == 202 and again.json() == first.json()
        assert_problem(c.post(url, json={"version": "another"}), 409, "conflict")


def test_unexpected_error_is_a_bare_500(faulty: tuple[Api, FaultyStore]) -> None:
    api, store = faulty
    with api.client(api.make_key()) as c:
        card, version = upload(c)
        store.failing = {"head": RuntimeError("boom at /var/lib/secret/path")}
        r = c.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
        assert assert_problem(r, 500, "internal_error") == {
            "type": "https://darkroom.dev/problems/internal_error",
            "title": "Internal Server Error",
            "status": 500,
        }


def test_keys_are_stored_hashed_and_work(local_api: Api) -> None:
    api = local_api
    key = api.make_key("carol", admin=True)
    assert key.startswith("dk_") and len(key) > 40
    with psycopg.connect(api.db_url) as conn:
        rows = conn.execute(SQL["api_key_rows"]).fetchall()
    assert rows == [(hash_key(key), "carol", True)]
    assert key not in repr(rows)
    with api.client(key) as c:
        assert c.get("/v1/queue").status_code == 200


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "darkroom.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_keys_create_command(db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "DARKROOM_DATABASE_URL": db_url, "DARKROOM_DATA_DIR": str(tmp_path)}
    done = run_cli("keys", "create", "--owner", "dave", env=env)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("dk_") and "\n" not in key
    assert "shown only this once" in done.stderr
    bad = run_cli("keys", "create", "--owner", " ", env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_api_command_fails_fast_with_one_line(db_url: str, tmp_path: Path) -> None:
    base = {**os.environ, "DARKROOM_DATABASE_URL": db_url, "DARKROOM_DATA_DIR": str(tmp_path)}
    cases = [
        {"DARKROOM_STORAGE_URL": "ftp://nowhere"},
        {
            "DARKROOM_STORAGE_URL": "s3://no-such-bucket-here",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
        },
        {
            "DARKROOM_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
            "DARKROOM_STORAGE_URL": (tmp_path / "o").as_uri(),
        },
        {"DARKROOM_MAX_UPLOAD_BYTES": "zero"},
    ]
    for extra in cases:
        done = run_cli("api", "--port", str(free_port()), env={**base, **extra})
        assert done.returncode == 2, (extra, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_api_command_serves_and_stops_on_sigterm(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DARKROOM_DATABASE_URL": db_url,
        "DARKROOM_DATA_DIR": str(tmp_path),
        "DARKROOM_STORAGE_URL": (tmp_path / "objects").as_uri(),
    }
    log = tmp_path / "api.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "darkroom.cli", "api", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                return False

        wait_for(healthy, timeout=30, what="the API")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0  # a deadline, not a measurement
        # Logs are JSON, one object a line.
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert lines and all(line.startswith("{") for line in lines), lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_start_up_heap_is_frozen(local_api: Api) -> None:
    """The collector's full passes skip what start-up allocated (see create_app), in an API
    process of its own, not in the test runner's."""
    script = (
        "import asyncio, gc\n"
        "from darkroom.api.app import create_app\n"
        "from darkroom.config import load_settings\n"
        "app = create_app(load_settings(), fail_fast=False)\n"
        "async def main():\n"
        "    before = gc.get_freeze_count()\n"
        "    async with app.router.lifespan_context(app):\n"
        "        print(before, gc.get_freeze_count())\n"
        "asyncio.run(main())\n")
    settings = local_api.settings
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
           "DARKROOM_DATABASE_URL": str(settings.database_url),
           "DARKROOM_STORAGE_URL": settings.resolved_storage_url,
           "DARKROOM_DATA_DIR": str(settings.data_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before == 0 and after > 10_000
