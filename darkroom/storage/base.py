"""The object-store interface every store implements, and the rules they share.

Objects are versioned and immutable: every `put` creates a new version and returns its
id, and readers always name the exact version they want. That is what lets the queue
record "this exact original" at confirm time and lets attempts publish derivatives side by
side without ever overwriting one another.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import BinaryIO, Protocol, runtime_checkable

# Bodies are read in pieces of this size so an upload never sits whole in memory.
CHUNK_SIZE = 1024 * 1024

MAX_KEY_LENGTH = 512
# A segment starts with a letter, digit or underscore: never "." (so "..", "." and hidden
# names are out) and never "@", which the local store reserves for its version files.
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
# What a prefix may end in: the start of a segment, possibly empty.
_PARTIAL_SEGMENT = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,199})?")
# RFC 9110 token "/" token, plus parameters; no control characters, so a stored type can
# be sent back as a header without any chance of splitting the response.
_CONTENT_TYPE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+(?:;[ -~]*)?")

Body = bytes | bytearray | memoryview | BinaryIO


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    version: str
    size: int
    content_type: str


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    key: str
    version: str
    size: int
    # When the version was written (UTC): reconciliation leaves young objects alone.
    modified: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class PresignedRequest:
    """A request the client sends straight to the store, bypassing the API."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class ObjectStore(Protocol):
    """A versioned object store. All methods are synchronous and thread-safe.

    Errors: `ObjectMissing` for an absent key or version, `StorageUnavailable` for a
    transient fault worth retrying, `StorageConfigError` when the store cannot work as
    configured, `ValueError` for a malformed key or content type (a programming error).
    """

    # True when `head` answers from local metadata (a stat and a tiny read) in
    # microseconds, so an event loop may call it directly instead of via a thread.
    inline_head: bool

    def put(self, key: str, body: Body, *, content_type: str = "application/octet-stream") -> str:
        """Store a new immutable version of `key` and return its version id."""
        ...

    def get(self, key: str, version: str) -> bytes:
        """The bytes of exactly this version."""
        ...

    def head(self, key: str, version: str) -> ObjectInfo:
        """Size and content type of exactly this version."""
        ...

    def digest(self, key: str, version: str) -> str:
        """The sha256 (lowercase hex) of exactly this version's bytes.

        From a checksum the store verified when the bytes arrived, where it keeps one;
        otherwise by reading the bytes in pieces (never the whole object in memory).
        """
        ...

    def delete(self, key: str, version: str | None = None) -> None:
        """Delete one version, or every version of the key when `version` is None.

        Deleting what is already gone is not an error.
        """
        ...

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        """Every version of every key that starts with `prefix` (a string prefix).

        The versions of one key come together, newest first; keys come in no promised order.
        """
        ...

    def presign_put(
        self, key: str, *, content_type: str, expires: int = 900, size: int | None = None
    ) -> PresignedRequest | None:
        """A request that uploads a new version of `key` directly, or None if unsupported.

        The version id of such an upload is the store's answer to that request
        (`x-amz-version-id` for S3). With `size`, the request is bound to a body of
        exactly that many bytes: the store refuses any other.
        """
        ...

    def presign_get(self, key: str, version: str, *, expires: int = 300) -> str | None:
        """A short-lived URL that downloads exactly this version, or None if unsupported."""
        ...

    def check(self) -> None:
        """Readiness and start-up check: reachable and correctly configured, or raise."""
        ...


def validate_key(key: str) -> str:
    """Return `key` if it is a well-formed object key, else raise ValueError.

    Keys are relative, slash-separated and free of empty, "." and ".." segments, so the
    same key means the same thing to every store and can never escape the local root.
    """
    if not isinstance(key, str) or not key:
        raise ValueError("object key must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError("object key is too long")
    if not all(_SEGMENT.fullmatch(part) for part in key.split("/")):
        raise ValueError("object key has an invalid segment")
    return key


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if some valid key could start with it, else raise ValueError."""
    if not isinstance(prefix, str):
        raise ValueError("prefix must be a string")
    if not prefix:
        return prefix
    if len(prefix) > MAX_KEY_LENGTH:
        raise ValueError("prefix is too long")
    *whole, last = prefix.split("/")
    if not all(_SEGMENT.fullmatch(part) for part in whole):
        raise ValueError("prefix has an invalid segment")
    if not _PARTIAL_SEGMENT.fullmatch(last):
        raise ValueError("prefix has an invalid segment")
    return prefix


def validate_content_type(content_type: str) -> str:
    if (
        not isinstance(content_type, str)
        or len(content_type) > 255
        or not _CONTENT_TYPE.fullmatch(content_type)
    ):
        raise ValueError("invalid content type")
    return content_type


def validate_expires(expires: int) -> int:
    # SigV4 presigned URLs are valid for at most seven days.
    if not isinstance(expires, int) or not 1 <= expires <= 7 * 24 * 3600:
        raise ValueError("expires must be between 1 second and 7 days")
    return expires
