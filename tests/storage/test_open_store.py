from __future__ import annotations

from pathlib import Path

import pytest

from darkroom.errors import StorageConfigError
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
