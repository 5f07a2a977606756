"""`darkroom import DIR [--wait] [--bulk]` against a real API (and, for --wait, a real worker)."""

from __future__ import annotations

import io
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from PIL import Image

from darkroom.cli import main as cli_main
from darkroom.config import load_settings
from darkroom.importer import find_images, main, media_type_of
from darkroom.progress import Bar
from tests.api.conftest import Api
from tests.api.helpers import image_bytes
from tests.support.services import wait_for
from tests.support.sql import SQL


def make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.jpg").write_bytes(image_bytes("JPEG"))
    (root / "sub" / "b.png").write_bytes(image_bytes("PNG"))
    (root / "sub" / "deeper" / "c.webp").write_bytes(image_bytes("WEBP"))
    (root / "sub" / "named-wrong.txt").write_bytes(image_bytes("GIF"))  # content decides
    (root / "notes.txt").write_text("not an image")
    (root / "sub" / "fake.jpg").write_text("text with an image name")


def test_sniff_and_find(tmp_path: Path) -> None:
    make_tree(tmp_path)
    images, skipped = find_images(tmp_path)
    assert [(p.relative_to(tmp_path).as_posix(), t) for p, t in images] == [
        ("a.jpg", "image/jpeg"),
        ("sub/b.png", "image/png"),
        ("sub/named-wrong.txt", "image/gif"),
        ("sub/deeper/c.webp", "image/webp"),
    ]
    assert skipped == 2
    assert media_type_of(tmp_path / "missing") is None
    # Every format the worker derives, not only the four above: the table is the deriver's.
    tiff = tmp_path / "scan"
    tiff.write_bytes(image_bytes("TIFF"))
    assert media_type_of(tiff) == "image/tiff"


def test_import_uploads_and_confirms(
    local_api: Api, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = local_api
    key = api.make_key("importer")
    tree = tmp_path / "photos"
    tree.mkdir()
    make_tree(tree)
    settings = load_settings(api_url=api.url, api_key=key)
    assert main(settings, directory=str(tree), wait=False, concurrency=3) == 0
    out, err = capsys.readouterr()
    assert "4 images to upload, 2 non-image files skipped" in err
    assert "upload   [" in err and "4/4" in err
    assert "sub/deeper/c.webp" in out and "queued" in out
    with api.client(key) as c:
        items = c.get("/v1/files").json()["items"]
    assert sorted(i["filename"] for i in items) == ["a.jpg", "b.png", "c.webp", "named-wrong.txt"]
    assert {i["status"] for i in items} == {"queued"}


def test_import_wait_reports_rejections(
    page_api: Api,
    worker_process: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = page_api
    key = api.make_key("importer")
    tree = tmp_path / "photos"
    tree.mkdir()
    (tree / "good.png").write_bytes(image_bytes("PNG"))
    (tree / "truncated.jpg").write_bytes(image_bytes("JPEG")[:60])  # JPEG magic, cut short
    settings = load_settings(api_url=api.url, api_key=key)
    assert main(settings, directory=str(tree), wait=True, concurrency=2) == 1
    out, err = capsys.readouterr()
    assert "process  [" in err and "2/2" in err
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert lines["good.png"] == ["ready"]
    assert lines["truncated.jpg"][0] == "rejected"
    assert "1 ready, 1 rejected" in err

    (tree / "truncated.jpg").unlink()
    assert main(settings, directory=str(tree), wait=True, concurrency=2) == 0


def test_missing_key_or_bad_key_is_one_line_and_exit_2(
    local_api: Api,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DARKROOM_API_KEY", raising=False)
    # No key in the environment and no terminal to ask at.
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert cli_main(["import", str(tmp_path), "--api", local_api.url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DARKROOM_API_KEY" in err

    # A key in argv is refused, with the reason: `ps` shows it to every user.
    assert cli_main(["import", str(tmp_path), "--api", local_api.url, "--key", "dk_x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--key is not taken" in err and "dk_x" not in err

    monkeypatch.setenv("DARKROOM_API_KEY", "dk_bad")
    assert cli_main(["import", str(tmp_path), "--api", local_api.url]) == 2
    assert capsys.readouterr().err.strip().endswith("the API key was not accepted")

    assert cli_main(["import", str(tmp_path), "--api", "http://127.0.0.1:9"]) == 2
    assert "cannot reach the API" in capsys.readouterr().err

    assert cli_main(["import", str(tmp_path / "nope"), "--api", local_api.url]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_key_from_a_prompt_at_the_terminal(local_api: Api, tmp_path: Path) -> None:
    """Without DARKROOM_API_KEY the key is asked for at the terminal, not echoed."""
    api = local_api
    key = api.make_key("prompted")
    (tmp_path / "a.png").write_bytes(image_bytes("PNG"))
    env = {k: v for k, v in os.environ.items() if k != "DARKROOM_API_KEY"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: darkroom import on the terminal's far side
        os.execve(sys.executable, [sys.executable, "-m", "darkroom.cli", "import",
                                   str(tmp_path), "--api", api.url], env)
    seen = b""
    try:
        while b"API key:" not in seen:
            seen += os.read(fd, 1024)
        os.write(fd, key.encode() + b"\n")
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child ended: EIO on the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert key.encode() not in seen  # not echoed
    assert b"1 uploaded" in seen


def distinct_pngs(root: Path, n: int) -> list[str]:
    names = []
    for i in range(n):
        name = f"p{i:03d}.png"
        colour = (i * 37 % 256, i * 91 % 256, i * 13 % 256)
        out = io.BytesIO()
        Image.new("RGB", (24, 16), colour).save(out, format="PNG")
        (root / name).write_bytes(out.getvalue())
        names.append(name)
    return names


def test_import_run_again_uploads_nothing_and_counts_already_there(
    api: Api, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On both stores: with S3 the bytes go straight to SeaweedFS by the presigned URL."""
    key = api.make_key("again")
    tree = tmp_path / "photos"
    tree.mkdir()
    names = distinct_pngs(tree, 5)
    settings = load_settings(api_url=api.url, api_key=key)
    assert main(settings, directory=str(tree), wait=False, concurrency=2, bulk=True) == 0
    assert "5 uploaded, 0 already there" in capsys.readouterr().err
    # The same bytes under another name: the archive has them already.
    (tree / "copy.png").write_bytes((tree / names[0]).read_bytes())
    assert main(settings, directory=str(tree), wait=False, concurrency=2) == 0
    out, err = capsys.readouterr()
    assert "6/6, 6 already there" in err
    assert "0 uploaded, 6 already there" in err
    assert "already there" in next(line for line in out.splitlines() if "copy.png" in line)
    with api.client(key) as c:
        assert len(c.get("/v1/files").json()["items"]) == 5


def test_import_killed_half_way_and_run_again_ends_with_one_ready_card_per_file(
    page_api: Api,
    worker_process: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    api = page_api
    key = api.make_key("resumer")
    tree = tmp_path / "photos"
    tree.mkdir()
    names = distinct_pngs(tree, 40)
    env = {**os.environ, "DARKROOM_API_KEY": key, "DARKROOM_API_URL": api.url}
    command = [sys.executable, "-m", "darkroom.cli", "import", str(tree), "--concurrency", "1"]
    db = psycopg.connect(api.db_url, autocommit=True)

    def count() -> int:
        row = db.execute(SQL["cards_of_owner"], {"owner": "resumer"}).fetchone()
        return int(row[0]) if row else 0

    try:
        with open(tmp_path / "first.log", "wb") as log:
            first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_for(lambda: count() >= 6 or first.poll() is not None, timeout=120,
                         interval=0.01, what="the first run to make a few cards")
                first.send_signal(signal.SIGKILL)
            finally:
                first.wait(30)
        assert first.returncode == -signal.SIGKILL
        made = count()
        assert 6 <= made < len(names)

        second = subprocess.run([*command, "--wait"], env=env, capture_output=True,
                                text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert f"{made - 1} already there" in second.stderr or (
            f"{made} already there" in second.stderr)
        rows = db.execute(SQL["owner_files"], {"owner": "resumer"}).fetchall()
        assert [r[0] for r in rows] == names  # exactly one card per file
        assert {r[1] for r in rows} == {"ready"}
    finally:
        db.close()


def test_bar_prints_milestones_off_a_terminal() -> None:
    stream = io.StringIO()
    bar = Bar("upload", 8, stream)
    for _ in range(8):
        bar.advance()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("0/8") and lines[-1].endswith("8/8")
    assert len(lines) == 5
    assert "\r" not in stream.getvalue()
    assert sys.stderr is not stream
