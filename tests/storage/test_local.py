"""What only the local store promises: its layout, atomic puts, crash safety."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from darkroom.errors import ObjectMissing, StorageConfigError
from darkroom.storage import LocalStore
from darkroom.storage.base import CHUNK_SIZE
from darkroom.storage.local import new_version

REPO = Path(__file__).resolve().parents[2]


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class Exploding(io.RawIOBase):
    """Gives `good` bytes, then fails as a dropped client connection would."""

    def __init__(self, good: int) -> None:
        self.left = good
        self.requested: list[int] = []

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.requested.append(size)
        if self.left <= 0:
            raise ConnectionResetError("client went away")
        n = min(size if size > 0 else CHUNK_SIZE, self.left)
        self.left -= n
        return b"x" * n


def test_layout_is_one_file_per_version(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    version = store.put("derived/a/b.webp", b"webp", content_type="image/webp")
    assert all_files(tmp_path) == [
        f"derived/a/b.webp/@{version}",
        f"derived/a/b.webp/@{version}.type",
    ]
    assert (tmp_path / "derived/a/b.webp" / f"@{version}").read_bytes() == b"webp"


def test_version_ids_are_unique_and_sort_by_creation() -> None:
    ids = [new_version() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{8}", v) for v in ids)


def test_an_interrupted_put_leaves_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    body = Exploding(3 * CHUNK_SIZE + 5)
    with pytest.raises(ConnectionResetError):
        store.put("originals/broken", body)  # type: ignore[arg-type]
    assert list(store.list("")) == []
    assert all_files(tmp_path) == []
    # Streamed in pieces, never read whole.
    assert len(body.requested) > 3 and max(body.requested) <= CHUNK_SIZE


def test_leftovers_of_a_crash_are_invisible(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    version = store.put("originals/c", b"real")
    key_dir = tmp_path / "originals" / "c"
    (key_dir / ".tmp-0000000000000001-deadbeef").write_bytes(b"half")
    (key_dir / "@0000000000000002-deadbeef.type").write_text("image/png")  # sidecar only
    (key_dir / "@junk").write_bytes(b"?")
    assert [(v.key, v.version) for v in store.list("")] == [("originals/c", version)]
    with pytest.raises(ObjectMissing):
        store.get("originals/c", "0000000000000002-deadbeef")
    store.delete("originals/c")
    assert [p.name for p in key_dir.iterdir()] == [".tmp-0000000000000001-deadbeef"]


CRASHING_PUT = """
import sys, threading
from pathlib import Path
from darkroom.storage import LocalStore

class Stalls:
    def __init__(self): self.sent = 0
    def read(self, size=-1):
        if self.sent >= 2:
            print("writing", flush=True)
            threading.Event().wait()  # hangs mid-body until killed
        self.sent += 1
        return b"y" * size

LocalStore(Path(sys.argv[1])).put("originals/crash", Stalls())
"""


def test_a_put_killed_mid_write_leaves_nothing_visible(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    before = store.put("originals/crash", b"before")
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PUT, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(10)
    assert [v.version for v in store.list("")] == [before]
    assert store.get("originals/crash", before) == b"before"
    assert any(p.name.startswith(".tmp-") for p in (tmp_path / "originals/crash").iterdir())
    after = store.put("originals/crash", b"after")
    assert [v.version for v in store.list("")] == [after, before]


def test_delete_during_a_put_of_the_same_key(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    old = store.put("originals/race", b"old")
    reading, release = threading.Event(), threading.Event()

    class Slow(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            if not reading.is_set():
                reading.set()
                release.wait(10)
                return b"new"
            return b""

    result: list[str] = []
    writer = threading.Thread(target=lambda: result.append(store.put("originals/race", Slow())))  # type: ignore[arg-type]
    writer.start()
    assert reading.wait(10)
    store.delete("originals/race")  # the put in flight keeps its directory alive
    release.set()
    writer.join(10)
    assert [v.version for v in store.list("")] == result
    assert store.get("originals/race", result[0]) == b"new"
    with pytest.raises(ObjectMissing):
        store.get("originals/race", old)


def test_delete_prunes_empty_directories_but_not_the_root(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalStore(root)
    version = store.put("derived/x/y.webp", b"1")
    store.delete("derived/x/y.webp", version)
    assert root.is_dir() and list(root.iterdir()) == []


def test_check_creates_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a" / "b")
    store.check()
    assert (tmp_path / "a" / "b").is_dir()


def test_check_refuses_an_unusable_root_without_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageConfigError) as refused:
        LocalStore(blocker / "objects").check()
    assert str(tmp_path) not in str(refused.value)


def test_a_relative_root_is_refused() -> None:
    with pytest.raises(StorageConfigError):
        LocalStore(Path("relative/dir"))


def test_versions_cannot_reach_outside_the_key(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"secret")
    store = LocalStore(tmp_path / "objects")
    store.put("originals/k", b"k")
    for version in ["../../../secret", "/etc/passwd", "@x", ".", ""]:
        with pytest.raises(ObjectMissing):
            store.get("originals/k", version)
        store.delete("originals/k", version)
    assert (tmp_path / "secret").read_bytes() == b"secret"


def test_head_writes_nothing_not_even_an_access_time(tmp_path: Path) -> None:
    # The API HEADs on its event loop: a read that dirtied an inode could wait on the
    # journal behind someone else's fsync.
    store = LocalStore(tmp_path / "objects")
    version = store.put("originals/x", b"bytes", content_type="image/png")
    paths = store._version_paths("originals/x", version)
    assert paths is not None
    before = {p: os.stat(p) for p in paths}
    for p, st in before.items():  # relatime would update an atime older than the mtime
        os.utime(p, ns=(st.st_mtime_ns - 10**11, st.st_mtime_ns))
    info = store.head("originals/x", version)
    assert (info.size, info.content_type) == (5, "image/png")
    for p, st in before.items():
        assert os.stat(p).st_atime_ns == st.st_mtime_ns - 10**11
