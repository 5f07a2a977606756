"""`darkroom import DIR [--wait] [--bulk]`: upload every image under DIR through the API.

It is an ordinary API client (create, PUT, confirm; then poll), so it works against any
darkroom, local or remote, with either store. Uploads run on a few threads sharing one
httpx client; the progress bar is `progress.Bar` on stderr.

It is safe to run again, and to retry: every create carries the file's sha256 and an
Idempotency-Key made from the file's path and content. A run cut short (Ctrl-C, a lost
network, a kill) and started again gets the cards the first run made: what was confirmed
is "already there", what was uploaded but not confirmed is confirmed, and only the rest
is uploaded. A request whose answer was lost is sent again with the same key.

The key comes from DARKROOM_API_KEY or a prompt, never from the command line, where
every user of the machine could read it in `ps`.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import random
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from darkroom.config import ConfigError, Settings
from darkroom.formats import HEAD_BYTES, media_type
from darkroom.progress import ALREADY, Bar

FINAL = ("ready", "rejected")
_POLL_SECONDS = 0.5
_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# A request whose answer was lost or refused for a passing reason is sent again, the
# same request (the same Idempotency-Key), after a jittered exponential pause.
_TRIES = 6
_RETRY_BASE_SECONDS = 0.5
_RETRY_CAP_SECONDS = 8.0
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def media_type_of(path: Path) -> str | None:
    """The media type of an image we accept, from its first bytes; None for anything else
    (the name and extension are not asked)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return None
    return media_type(head)


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
            kind = media_type_of(path)
            if kind is None:
                skipped += 1
            else:
                images.append((path, kind))
    return images, skipped


@dataclass
class Item:
    path: Path
    media_type: str
    file_id: str | None = None
    status: str = "not uploaded"
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    already: bool = False  # the archive had it before this run (no upload)
    key: str = ""


class Fatal(Exception):
    """Stops the whole import: one line for the user, exit 2."""


class Importer:
    def __init__(self, client: httpx.Client, api_url: str, *, root: Path | None = None,
                 bulk: bool = False, rng: random.Random | None = None) -> None:
        self.client = client
        self.api_origin = _origin(api_url)
        self.root = root
        self.bulk = bulk
        self._rng = rng or random.Random()

    def _check(self, response: httpx.Response) -> None:
        if response.status_code == 401:
            raise Fatal("the API key was not accepted")

    def _send(self, method: str, url: str, *, own: bool = True, **kwargs: Any
              ) -> httpx.Response:
        """One request, sent again while its answer is lost or a passing refusal.

        Every request the import sends is safe to repeat: creates carry their key, a
        confirm of the same version is idempotent, and an upload only adds a version.
        """
        for attempt in range(1, _TRIES + 1):
            body = kwargs.get("content")
            if body is not None and hasattr(body, "seek"):
                body.seek(0)  # a file sent again is sent whole
            try:
                if own:
                    r = self.client.request(method, url, **kwargs)
                else:
                    # A presigned URL carries its own authority: our bearer key must not go.
                    r = httpx.request(method, url, timeout=_TIMEOUT, **kwargs)
            except httpx.TransportError:
                if attempt == _TRIES:
                    raise
            else:
                self._check(r)
                if r.status_code not in _RETRY_STATUSES or attempt == _TRIES:
                    return r
            ceiling = min(_RETRY_CAP_SECONDS, _RETRY_BASE_SECONDS * 2 ** (attempt - 1))
            time.sleep(self._rng.uniform(0, ceiling))  # a client's backoff, not a test's wait
        raise AssertionError("unreachable")

    def upload(self, item: Item) -> None:
        size = item.path.stat().st_size
        digest = file_sha256(item.path)
        item.key = import_key(item.path, self.root, digest)
        fields: dict[str, Any] = {"filename": item.path.name, "content_type": item.media_type,
                                  "size": size, "sha256": digest}
        if self.bulk:
            # A hint for the server's scheduling (DESIGN §9, `--bulk`); a server without
            # priorities ignores the field, and the request fingerprint does not include it.
            fields["priority"] = "bulk"
        r = self._send("POST", "/v1/files", json=fields,
                       headers={"Idempotency-Key": item.key})
        if r.status_code == 200:  # the archive has it: this run uploads nothing
            card = r.json()
            item.file_id, item.status, item.already = card["id"], card["status"], True
            item.error = card.get("error_code")
            return
        if r.status_code != 201:
            item.status, item.error = "failed", _problem_text(r)
            return
        card = r.json()
        item.file_id = card["id"]
        if card.get("uploaded_version"):
            # An earlier run uploaded it and was cut off before confirming.
            r = self._confirm(item, card["uploaded_version"])
            if r.status_code == 202:
                item.status = r.json()["status"]
                return
        version = self._put(item, card["upload"])
        if version is None:
            return
        r = self._confirm(item, version)
        if r.status_code != 202:
            item.status, item.error = "failed", _problem_text(r)
            return
        item.status = r.json()["status"]

    def _put(self, item: Item, upload: dict[str, Any]) -> str | None:
        # The API's own upload URL is relative unless it knows its public origin.
        url = urljoin(str(self.client.base_url), upload["url"])
        own = _origin(url) == self.api_origin
        with open(item.path, "rb") as body:
            r = self._send(upload["method"], url, own=own, content=body,
                           headers=upload["headers"])
        if r.status_code != 200:
            item.status, item.error = "failed", _problem_text(r)
            return None
        version = r.json()["version"] if own else r.headers.get("x-amz-version-id")
        if not version:
            item.status, item.error = "failed", "the store returned no version id"
            return None
        return str(version)

    def _confirm(self, item: Item, version: str) -> httpx.Response:
        return self._send("POST", f"/v1/files/{item.file_id}/confirm",
                          json={"version": version})

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


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def import_key(path: Path, root: Path | None, digest: str) -> str:
    """Stable for a file's path (under DIR) and content: a run again after an interruption
    sends the same key for the same file, and an edited file gets a new one."""
    name = path.relative_to(root).as_posix() if root is not None else path.as_posix()
    return "import-" + hashlib.sha256(f"{name}\0{digest}".encode()).hexdigest()


def api_key(settings: Settings) -> str:
    """From DARKROOM_API_KEY, else asked at the terminal (never echoed, never in argv)."""
    if settings.api_key:
        return settings.api_key
    if not sys.stdin.isatty():
        raise ConfigError("no API key: set DARKROOM_API_KEY (or run in a terminal to be asked)")
    try:
        key = getpass.getpass("darkroom API key: ").strip()
    except EOFError:
        key = ""
    if not key:
        raise ConfigError("no API key given")
    return key


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
        except (httpx.HTTPError, OSError) as exc:
            item.status, item.error = "failed", type(exc).__name__
        bar.advance(failed=item.status == "failed", already=item.already)

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
    rows = [(str(i.path.relative_to(root)), i.status,
             ", ".join(filter(None, [i.error, ALREADY if i.already else None])))
            for i in items]
    width = max([len("file")] + [len(r[0]) for r in rows])
    yield f"{'file':<{width}}  {'status':<12}  note"
    for name, status, error in rows:
        yield f"{name:<{width}}  {status:<12}  {error}".rstrip()


def main(settings: Settings, *, directory: str, wait: bool, concurrency: int,
         bulk: bool = False) -> int:
    api_url = settings.api_url.rstrip("/")
    if urlsplit(api_url).scheme not in ("http", "https") or not urlsplit(api_url).netloc:
        raise ConfigError("--api must be an http(s):// URL (or set DARKROOM_API_URL)")
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"not a directory: {directory}")
    key = api_key(settings)

    images, skipped = find_images(root)
    note = f", {skipped} non-image file{'s' if skipped != 1 else ''} skipped" if skipped else ""
    print(
        f"darkroom: {len(images)} image{'s' if len(images) != 1 else ''} to upload{note}",
        file=sys.stderr,
    )
    items = [Item(path, kind) for path, kind in images]
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with (
            httpx.Client(base_url=api_url, headers=headers, timeout=_TIMEOUT) as client,
            ThreadPoolExecutor(max_workers=concurrency) as pool,
        ):
            importer = Importer(client, api_url, root=root, bulk=bulk)
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
    already = sum(1 for i in items if i.already and i.status != "failed")
    summary = f"{len(items) - len(failed) - already} uploaded, {already} {ALREADY}"
    if wait:
        ready = sum(1 for i in items if i.status == "ready")
        summary += f", {ready} ready, {len(rejected)} rejected"
    if failed:
        summary += f", {len(failed)} failed to upload"
    if skipped:
        summary += f", {skipped} skipped (not images)"
    print(f"darkroom: {summary}", file=sys.stderr)
    return 1 if failed or rejected else 0
