"""The object-store contract: every test runs against the local store and real S3."""

from __future__ import annotations

import hashlib
import io
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from darkroom.errors import ObjectMissing
from darkroom.storage import LocalStore, ObjectInfo, ObjectStore, ObjectVersion, S3Store


class OneWayStream(io.RawIOBase):
    """A readable stream that cannot seek, like a request body off the network."""

    def __init__(self, data: bytes, piece: int = 64 * 1024) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._piece = piece

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._piece, len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def versions(store: ObjectStore, prefix: str) -> list[ObjectVersion]:
    return list(store.list(prefix))


def test_put_returns_a_version_that_reads_back(store: ObjectStore) -> None:
    version = store.put("originals/a", b"hello", content_type="image/jpeg")
    assert isinstance(version, str) and version
    assert store.get("originals/a", version) == b"hello"
    assert store.head("originals/a", version) == ObjectInfo("originals/a", version, 5, "image/jpeg")


def test_default_content_type(store: ObjectStore) -> None:
    version = store.put("originals/b", b"x")
    assert store.head("originals/b", version).content_type == "application/octet-stream"


def test_every_put_is_a_new_immutable_version(store: ObjectStore) -> None:
    first = store.put("originals/same", b"one", content_type="text/plain")
    second = store.put("originals/same", b"two!", content_type="image/webp")
    assert first != second
    assert store.get("originals/same", first) == b"one"
    assert store.get("originals/same", second) == b"two!"
    assert store.head("originals/same", first).content_type == "text/plain"
    assert store.head("originals/same", second) == ObjectInfo(
        "originals/same", second, 4, "image/webp"
    )


def test_empty_object(store: ObjectStore) -> None:
    version = store.put("originals/empty", b"")
    assert store.get("originals/empty", version) == b""
    assert store.head("originals/empty", version).size == 0


def test_missing_key_and_missing_version(store: ObjectStore) -> None:
    version = store.put("originals/here", b"x")
    other = store.put("originals/other", b"y")
    for key, v in [
        ("originals/absent", version),
        ("originals/here", other),  # a real version id, of another key
        ("originals/here", "0" * 16 + "-" + "0" * 8),
        ("originals/here", "not-a-version"),
        ("originals/here", "../../../etc/passwd"),
        ("originals/here", ""),
    ]:
        with pytest.raises(ObjectMissing):
            store.get(key, v)
        with pytest.raises(ObjectMissing):
            store.head(key, v)


def test_binary_streams_round_trip(store: ObjectStore) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    seekable = store.put("derived/f/seekable.webp", io.BytesIO(data), content_type="image/webp")
    stream = OneWayStream(data)
    one_way = store.put("derived/f/one-way.webp", io.BufferedReader(stream, 64 * 1024))
    written = [("derived/f/seekable.webp", seekable), ("derived/f/one-way.webp", one_way)]
    for key, version in written:
        assert store.get(key, version) == data
        assert store.head(key, version).size == len(data)


def test_delete_one_version_keeps_the_others(store: ObjectStore) -> None:
    first = store.put("originals/d", b"1")
    second = store.put("originals/d", b"2")
    store.delete("originals/d", first)
    with pytest.raises(ObjectMissing):
        store.get("originals/d", first)
    assert store.get("originals/d", second) == b"2"
    assert [v.version for v in versions(store, "originals/d")] == [second]
    store.delete("originals/d", first)  # already gone: not an error


def test_delete_every_version_of_one_key_only(store: ObjectStore) -> None:
    doomed = [store.put("derived/k", bytes([i])) for i in range(3)]
    child = store.put("derived/k/child", b"c")
    sibling = store.put("derived/kk", b"s")
    store.delete("derived/k")
    for version in doomed:
        with pytest.raises(ObjectMissing):
            store.get("derived/k", version)
    assert store.get("derived/k/child", child) == b"c"
    assert store.get("derived/kk", sibling) == b"s"
    assert {v.key for v in versions(store, "derived/")} == {"derived/k/child", "derived/kk"}
    store.delete("derived/k")  # nothing left: not an error
    store.delete("never/was")


def test_list_is_every_version_under_a_string_prefix(store: ObjectStore) -> None:
    a1 = store.put("derived/abc/1.webp", b"a")
    a2 = store.put("derived/abc/1.webp", b"aa")
    b = store.put("derived/abd/2.webp", b"bbb")
    c = store.put("derived/x/3.webp", b"cccc")
    o = store.put("originals/abc", b"ooooo")

    assert set(versions(store, "derived/ab")) == {
        ObjectVersion("derived/abc/1.webp", a1, 1),
        ObjectVersion("derived/abc/1.webp", a2, 2),
        ObjectVersion("derived/abd/2.webp", b, 3),
    }
    assert {v.version for v in versions(store, "")} == {a1, a2, b, c, o}
    assert {v.version for v in versions(store, "derived/")} == {a1, a2, b, c}
    assert {v.version for v in versions(store, "derived")} == {a1, a2, b, c}
    assert {v.version for v in versions(store, "originals/abc")} == {o}
    assert versions(store, "derived/abc/1.webpx") == []
    assert versions(store, "nothing/") == []
    assert versions(store, "derived/q") == []


def test_list_gives_a_keys_versions_together_newest_first(store: ObjectStore) -> None:
    written = [store.put("originals/n", bytes([i])) for i in range(4)]
    assert [v.version for v in versions(store, "originals/n")] == written[::-1]


def test_concurrent_puts_all_survive(store: ObjectStore) -> None:
    def put(i: int) -> str:
        return store.put("originals/busy", f"{i}".encode())

    with ThreadPoolExecutor(8) as pool:
        written = list(pool.map(put, range(40)))
    assert len(set(written)) == 40
    assert {v.version for v in versions(store, "originals/busy")} == set(written)
    for i, version in enumerate(written):
        assert store.get("originals/busy", version) == f"{i}".encode()


BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "..",
    "../x",
    "a/../b",
    "a/./b",
    ".hidden",
    "a/.tmp-x",
    "a/@0123456789abcdef-01234567",
    "a\\b",
    "a\x00b",
    "a b",
    "a\nb",
    "é",
    "x" * 600,
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_malformed_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.get(key, "v")
    with pytest.raises(ValueError):
        store.head(key, "v")
    with pytest.raises(ValueError):
        store.delete(key)
    with pytest.raises(ValueError):
        store.presign_get(key, "v")


@pytest.mark.parametrize("prefix", ["/", "../", "a//", "..", "a/../", " "])
def test_malformed_prefixes_are_refused(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(ValueError):
        list(store.list(prefix))


@pytest.mark.parametrize("content_type", ["", "image", "image/png\r\nX-Evil: 1", "a/b\x00"])
def test_malformed_content_types_are_refused(store: ObjectStore, content_type: str) -> None:
    with pytest.raises(ValueError):
        store.put("originals/ct", b"x", content_type=content_type)
    assert versions(store, "originals/ct") == []


def test_check_passes_on_a_usable_store(store: ObjectStore) -> None:
    store.check()


def test_presigned_put_and_get(store: ObjectStore) -> None:
    request = store.presign_put("originals/p", content_type="image/png", expires=60)
    if isinstance(store, LocalStore):
        assert request is None
        version = store.put("originals/p", b"png")
        assert store.presign_get("originals/p", version) is None
        return
    assert request is not None and request.method == "PUT"
    body = os.urandom(100_000)
    sent = urllib.request.Request(
        request.url, data=body, method=request.method, headers=request.headers
    )
    with urllib.request.urlopen(sent, timeout=10) as answer:
        assert answer.status == 200
        version = answer.headers["x-amz-version-id"]
    assert version
    assert store.get("originals/p", version) == body
    assert store.head("originals/p", version).content_type == "image/png"

    url = store.presign_get("originals/p", version, expires=60)
    assert url is not None
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == body

    # The content type is signed: a PUT with another one is refused.
    forged = urllib.request.Request(
        request.url, data=b"x", method="PUT", headers={"Content-Type": "text/html"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=10)
    assert refused.value.code == 403
    assert [v.version for v in versions(store, "originals/p")] == [version]


def test_presigned_get_names_the_exact_version(store: ObjectStore) -> None:
    old = store.put("originals/pg", b"old")
    store.put("originals/pg", b"new")
    url = store.presign_get("originals/pg", old)
    if url is None:
        assert isinstance(store, LocalStore)
        return
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"old"


def test_list_and_delete_page_through_everything(store: ObjectStore) -> None:
    if isinstance(store, S3Store):
        store.page_size = 3  # so a few objects already span many pages
    written = {store.put(f"derived/m/{i:02d}.webp", b"m") for i in range(7)}
    written |= {store.put("derived/m/many", bytes([i])) for i in range(7)}
    assert {v.version for v in store.list("derived/m/")} == written
    store.delete("derived/m/many")
    assert len(list(store.list("derived/m/"))) == 7


def test_digest_is_the_sha256_of_exactly_that_version(store: ObjectStore) -> None:
    big = os.urandom(3 * 1024 * 1024 + 17)  # several read pieces
    first = store.put("dig/a", big)
    second = store.put("dig/a", b"other bytes")
    assert store.digest("dig/a", first) == hashlib.sha256(big).hexdigest()
    assert store.digest("dig/a", second) == hashlib.sha256(b"other bytes").hexdigest()
    with pytest.raises(ObjectMissing):
        store.digest("dig/missing", first)
    store.delete("dig/a", first)
    with pytest.raises(ObjectMissing):
        store.digest("dig/a", first)
