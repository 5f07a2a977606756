from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

from darkroom.errors import StorageConfigError, StorageUnavailable
from darkroom.storage import LocalStore, S3Store, open_store


def test_file_url(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/objects%20dir")
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "objects dir"
    assert isinstance(open_store("file://localhost/srv/x"), LocalStore)


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://photos", "photos", ""),
        ("s3://photos/", "photos", ""),
        ("s3://photos/darkroom", "photos", "darkroom/"),
        ("s3://my.photos-1/a/b/", "my.photos-1", "a/b/"),
    ],
)
def test_s3_url(monkeypatch: pytest.MonkeyPatch, url: str, bucket: str, prefix: str) -> None:
    # Building the client contacts nothing; credentials are only needed on first use.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    store = open_store(url)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == (bucket, prefix)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "relative/dir",
        "/abs/dir",
        "file:relative",
        "file://host/dir",
        "file:///a/../b",
        "http://example.com/bucket",
        "s3://",
        "s3:///prefix",
        "s3://UPPER",
        "s3://ab",
        "s3://a..b",
        "s3://bucket/../x",
        "s3://bucket/a//b",
        "s3://bucket/x?versionId=1",
    ],
)
def test_bad_urls_fail_with_one_line_that_does_not_repeat_them(url: str) -> None:
    with pytest.raises(StorageConfigError) as refused:
        open_store(url)
    message = str(refused.value)
    assert "\n" not in message
    if len(url) > 6:  # longer than the scheme the message itself names
        assert url not in message


def test_a_store_that_never_answers_fails_a_request_within_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DARKROOM_STORAGE_TIMEOUT_SECONDS bounds an S3 request's wait on a store that takes
    the connection and never answers: the store's failure (StorageUnavailable), after one
    more try, not a wait of 2 × the default 10 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # takes every connection and reads nothing back to it
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    store = open_store("s3://photos", timeout=0.5)
    failed = threading.Event()
    errors: list[BaseException] = []

    def get() -> None:
        try:
            store.get("originals/x", "v1")
        except BaseException as exc:
            errors.append(exc)
        failed.set()

    try:
        threading.Thread(target=get, daemon=True).start()
        assert failed.wait(timeout=8)  # a deadline: the default would wait 20 s
        assert len(errors) == 1 and isinstance(errors[0], StorageUnavailable), errors
        assert len(held) == 2  # the request and its one retry
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
