"""`darkroom import DIR [--wait]`: upload every image under DIR through the HTTP API.

It is an ordinary API client (create, PUT, confirm; then poll), so it works against any
darkroom, local or remote, with either store. Uploads run on a few threads sharing one
httpx client; the progress bar is a few lines of our own on stderr.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from darkroom.config import ConfigError, Settings

# The formats the API accepts, by their first bytes (the name and extension are not asked).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
FINAL = ("ready", "rejected")
_POLL_SECONDS = 0.5
_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def sniff(path: Path) -> str | None:
    """The media type of an image we accept, from its first bytes; None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    for magic, media_type in _MAGIC:
        if head.startswith(magic):
            return media_type
    return None


def find_images(directory: Path) -> tuple[list[tuple[Path, str]], int]:
    """Every accepted image under `directory` (recursive, in a stable order) and the number
    of other files skipped."""
    images: list[tuple[Path, str]] = []
    skipped = 0
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if not path.is_file():
                continue
            media_type = sniff(path)
            if media_type is None:
                skipped += 1
            else:
                images.append((path, media_type))
    return images, skipped


class Bar:
    """A one-line progress bar on stderr; redrawn in place on a terminal, and printed at
    a few milestones otherwise (so a log file gets lines, not carriage returns)."""

    WIDTH = 30

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.failed = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._lock = threading.Lock()
        self._last_milestone = -1
        self._draw()

    def advance(self, *, failed: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.failed += int(failed)
            self._draw()

    def _draw(self) -> None:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        extra = f", {self.failed} failed" if self.failed else ""
        line = f"{self.label:<8} [{bar}] {self.done}/{self.total}{extra}"
        if self.tty:
            self.stream.write("\r" + line)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            milestone = int(fraction * 4)  # 0 %, 25 %, 50 %, 75 %, 100 %
            if milestone != self._last_milestone:
                self._last_milestone = milestone
                self.stream.write(line + "\n")
        self.stream.flush()


@dataclass
class Item:
    path: Path
    media_type: str
    file_id: str | None = None
    status: str = "not uploaded"
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Fatal(Exception):
    """Stops the whole import: one line for the user, exit 2."""


class Importer:
    def __init__(self, client: httpx.Client, api_url: str) -> None:
        self.client = client
        self.api_origin = _origin(api_url)

    def _check(self, response: httpx.Response) -> None:
        if response.status_code == 401:
            raise Fatal("the API key was not accepted")

    def upload(self, item: Item) -> None:
        size = item.path.stat().st_size
        r = self.client.post(
            "/v1/files",
            json={"filename": item.path.name, "content_type": item.media_type, "size": size},
        )
        self._check(r)
        if r.status_code != 201:
            item.status, item.error = "failed", _problem_text(r)
            return
        card = r.json()
        item.file_id = card["id"]
        upload = card["upload"]
        own = _origin(upload["url"]) == self.api_origin
        with open(item.path, "rb") as body:
            if own:
                r = self.client.request(
                    upload["method"], upload["url"], content=body, headers=upload["headers"]
                )
            else:
                # A presigned URL carries its own authority: our bearer key must not go along.
                r = httpx.request(
                    upload["method"],
                    upload["url"],
                    content=body,
                    headers=upload["headers"],
                    timeout=_TIMEOUT,
                )
        self._check(r)
        if r.status_code != 200:
            item.status, item.error = "failed", _problem_text(r)
            return
        version = r.json()["version"] if own else r.headers.get("x-amz-version-id")
        if not version:
            item.status, item.error = "failed", "the store returned no version id"
            return
        r = self.client.post(f"/v1/files/{item.file_id}/confirm", json={"version": version})
        self._check(r)
        if r.status_code != 202:
            item.status, item.error = "failed", _problem_text(r)
            return
        item.status = r.json()["status"]

    def refresh(self, item: Item) -> None:
        r = self.client.get(f"/v1/files/{item.file_id}")
        self._check(r)
        if r.status_code == 404:
            item.status, item.error = "deleted", None
            return
        if r.status_code != 200:
            return  # a passing fault: ask again next round
        card = r.json()
        item.status = card["status"]
        item.error = card["error_code"]
        item.extra = card.get("derivative") or {}


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _problem_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("detail") or body.get("title") or response.status_code)
    except ValueError:
        return f"HTTP {response.status_code}"


def _run(pool: ThreadPoolExecutor, func: Any, items: list[Item], bar: Bar) -> None:
    def one(item: Item) -> None:
        try:
            func(item)
        except httpx.HTTPError as exc:
            item.status, item.error = "failed", type(exc).__name__
        bar.advance(failed=item.status == "failed")

    for future in [pool.submit(one, item) for item in items]:
        future.result()  # re-raises Fatal from any thread


def _wait(importer: Importer, pool: ThreadPoolExecutor, items: list[Item]) -> None:
    watched = [i for i in items if i.file_id and i.status not in ("failed", *FINAL)]
    bar = Bar("process", len(watched))
    open_items = watched
    while open_items:
        time.sleep(_POLL_SECONDS)  # a client's poll interval, not a test's wait
        list(pool.map(importer.refresh, open_items))
        still: list[Item] = []
        for item in open_items:
            if item.status in FINAL or item.status == "deleted":
                bar.advance(failed=item.status != "ready")
            else:
                still.append(item)
        open_items = still


def _table(items: list[Item], root: Path) -> Iterator[str]:
    rows = [(str(i.path.relative_to(root)), i.status, i.error or "") for i in items]
    width = max([len("file")] + [len(r[0]) for r in rows])
    yield f"{'file':<{width}}  {'status':<12}  error"
    for name, status, error in rows:
        yield f"{name:<{width}}  {status:<12}  {error}".rstrip()


def main(settings: Settings, *, directory: str, wait: bool, concurrency: int) -> int:
    if not settings.api_key:
        raise ConfigError("no API key: pass --key KEY or set DARKROOM_API_KEY")
    api_url = settings.api_url.rstrip("/")
    if urlsplit(api_url).scheme not in ("http", "https") or not urlsplit(api_url).netloc:
        raise ConfigError("--api must be an http(s):// URL (or set DARKROOM_API_URL)")
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"not a directory: {directory}")

    images, skipped = find_images(root)
    note = f", {skipped} non-image file{'s' if skipped != 1 else ''} skipped" if skipped else ""
    print(
        f"darkroom: {len(images)} image{'s' if len(images) != 1 else ''} to upload{note}",
        file=sys.stderr,
    )
    items = [Item(path, media_type) for path, media_type in images]
    headers = {"Authorization": f"Bearer {settings.api_key}"}
    try:
        with (
            httpx.Client(base_url=api_url, headers=headers, timeout=_TIMEOUT) as client,
            ThreadPoolExecutor(max_workers=concurrency) as pool,
        ):
            importer = Importer(client, api_url)
            # One request first: a wrong URL or key ends the run before any upload starts.
            importer._check(client.get("/v1/files", params={"limit": 1}))
            if items:
                _run(pool, importer.upload, items, Bar("upload", len(items)))
            if wait and items:
                _wait(importer, pool, items)
    except Fatal as exc:
        print(f"darkroom: {exc}", file=sys.stderr)
        return 2
    except httpx.TransportError:
        print(f"darkroom: cannot reach the API at {api_url}", file=sys.stderr)
        return 2

    for line in _table(items, root):
        print(line)
    failed = [i for i in items if i.status == "failed"]
    rejected = [i for i in items if i.status == "rejected"]
    summary = f"{len(items) - len(failed)} uploaded"
    if wait:
        ready = sum(1 for i in items if i.status == "ready")
        summary += f", {ready} ready, {len(rejected)} rejected"
    if failed:
        summary += f", {len(failed)} failed to upload"
    if skipped:
        summary += f", {skipped} skipped (not images)"
    print(f"darkroom: {summary}", file=sys.stderr)
    return 1 if failed or rejected else 0
