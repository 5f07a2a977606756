"""`darkroom up` as a newcomer runs it: one command, a photo to `ready`, a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support.services import CORPUS, free_port, wait_for
from tests.support.sql import SQL

# A fleet of real processes: not in `make test-fast`.
pytestmark = pytest.mark.fleet


def test_up_serves_a_photo_to_ready_and_stops_cleanly(tmp_path: Path, db_url: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    # The test's own database (the embedded one is exercised by `make run` and the
    # stats/migrate tests); everything else on up's defaults: local store in the data dir.
    env["DARKROOM_DATABASE_URL"] = db_url
    log = (tmp_path / "up.log").open("w+")
    up = subprocess.Popen(
        [sys.executable, "-m", "darkroom.cli", "up", "--data-dir", str(tmp_path / "data"),
         "--port", str(port), "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        def banner() -> re.Match[str] | None:
            return re.search(r"API key \(owner 'local', admin\): (\S+)",
                             Path(log.name).read_text())

        found = wait_for(banner, timeout=120, what="the URL and key banner")
        assert found is not None
        key = found.group(1)
        assert f"http://127.0.0.1:{port}/" in Path(log.name).read_text()
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}",
                           headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert api.get("/").status_code == 200
        photo = (CORPUS / "GreenTraditional.jpg").read_bytes()
        card = api.post("/v1/files", json={"filename": "g.jpg", "content_type": "image/jpeg",
                                           "size": len(photo)}).json()
        put = api.request(card["upload"]["method"], card["upload"]["url"], content=photo,
                          headers=card["upload"]["headers"])
        assert put.status_code == 200
        confirm = api.post(f"/v1/files/{card['id']}/confirm",
                           json={"version": put.json()["version"]})
        assert confirm.status_code == 202
        ready = wait_for(lambda: api.get(f"/v1/files/{card['id']}").json()["status"] == "ready",
                         timeout=120, what="ready")
        assert ready
        webp = api.get(f"/v1/files/{card['id']}/derivative", follow_redirects=True)
        assert webp.status_code == 200 and webp.content[8:12] == b"WEBP"

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=90) == 0
        output = Path(log.name).read_text()
        assert "darkroom stopped." in output
        # One start-up path: up migrates once, its API, worker and sweeper not again.
        assert output.count('"schema checked"') == 1, output
        with psycopg.connect(db_url) as conn:
            row = conn.execute(SQL["processing_count"]).fetchone()
        assert row == (0,)
        leftovers = subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True)
        assert leftovers.returncode == 1, "a child of `up` outlived it"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
