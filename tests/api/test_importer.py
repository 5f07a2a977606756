"""`darkroom import DIR [--wait]` against a real API (and, for --wait, a real worker)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from darkroom.cli import main as cli_main
from darkroom.config import load_settings
from darkroom.importer import Bar, find_images, main, sniff
from tests.api.conftest import Api


def image_bytes(fmt: str, size: tuple[int, int] = (40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 120, 40)).save(out, format=fmt)
    return out.getvalue()


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
    assert sniff(tmp_path / "missing") is None


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
    assert cli_main(["import", str(tmp_path), "--api", local_api.url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--key" in err

    assert cli_main(["import", str(tmp_path), "--api", local_api.url, "--key", "dk_bad"]) == 2
    assert capsys.readouterr().err.strip().endswith("the API key was not accepted")

    assert cli_main(["import", str(tmp_path), "--api", "http://127.0.0.1:9", "--key", "dk_x"]) == 2
    assert "cannot reach the API" in capsys.readouterr().err

    assert (
        cli_main(["import", str(tmp_path / "nope"), "--api", local_api.url, "--key", "dk_x"]) == 2
    )
    assert "not a directory" in capsys.readouterr().err


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
