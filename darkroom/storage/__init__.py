"""Object stores: one small versioned interface, a local directory and S3 behind it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from darkroom.config import STORAGE_TIMEOUT_SECONDS
from darkroom.errors import (
    ObjectMissing,
    StorageConfigError,
    StorageError,
    StorageUnavailable,
)
from darkroom.storage.base import (
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    PresignedRequest,
    validate_key,
)
from darkroom.storage.local import LocalStore

if TYPE_CHECKING:
    from darkroom.storage.s3 import S3Store, make_client

__all__ = [
    "LocalStore",
    "ObjectInfo",
    "ObjectMissing",
    "ObjectStore",
    "ObjectVersion",
    "PresignedRequest",
    "S3Store",
    "StorageConfigError",
    "StorageError",
    "StorageUnavailable",
    "make_client",
    "open_store",
    "validate_key",
]

_URL_SHAPE = "the storage URL must be file:///absolute/dir or s3://bucket[/prefix]"
# S3 bucket naming rules (lowercase, 3-63 characters, no leading or trailing dot/hyphen).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def open_store(url: str, *, timeout: float = STORAGE_TIMEOUT_SECONDS) -> ObjectStore:
    """The store a `DARKROOM_STORAGE_URL` names; it is not contacted until used or checked.
    `timeout`: an S3 request's wait for the store's answer (DARKROOM_STORAGE_TIMEOUT_SECONDS).

    The error messages never repeat the URL: it may carry credentials or private paths.
    """
    if not isinstance(url, str) or not url.strip():
        raise StorageConfigError(_URL_SHAPE)
    parts = urlsplit(url.strip())
    if parts.query or parts.fragment:
        raise StorageConfigError(_URL_SHAPE)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StorageConfigError(_URL_SHAPE)
        path = Path(unquote(parts.path))
        if ".." in path.parts:
            raise StorageConfigError("the storage directory must not contain '..'")
        return LocalStore(path)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not bucket:
            raise StorageConfigError(_URL_SHAPE)
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise StorageConfigError("the S3 bucket name in the storage URL is invalid")
        from darkroom.storage.s3 import S3Store

        return S3Store(bucket, unquote(parts.path), timeout=timeout)
    raise StorageConfigError(_URL_SHAPE)


def __getattr__(name: str) -> Any:
    """S3Store and make_client, imported on first use: boto3 is most of a command's
    start-up (`darkroom stats`, `migrate`, the embedded database's helpers), and only a
    process that talks to S3 needs it."""
    if name in ("S3Store", "make_client"):
        from darkroom.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
