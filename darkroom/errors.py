"""The public error codes of a card (DESIGN §5) and the exceptions that carry them.

A public code is a short, bounded word; the detail of what went wrong goes to the log and
the events table, never to the card or an HTTP answer.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    UNSUPPORTED_FORMAT = "unsupported_format"
    INVALID_IMAGE = "invalid_image"
    IMAGE_TOO_LARGE = "image_too_large"
    ORIGINAL_MISSING = "original_missing"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    PROCESSING_TIMEOUT = "processing_timeout"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    PROCESSING_FAILED = "processing_failed"


# Worth another attempt: the same bytes may well succeed later.
TRANSIENT_CODES = frozenset(
    {ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.PROCESSING_TIMEOUT}
)


# What `darkroom retry` and `POST /v1/files/{id}/retry` take back by default: the store or
# the clock failed (transient codes, recorded when the last attempt failed with one of
# them), or the attempts ran out. The others are the file's own: the same bytes would
# fail the same way (`darkroom retry --code` or `--all` takes them anyway).
RETRYABLE_CODES = TRANSIENT_CODES | {ErrorCode.ATTEMPTS_EXHAUSTED}


class DarkroomError(Exception):
    """Base class of the errors darkroom raises on purpose."""


class DeriveError(DarkroomError):
    """The pipeline could not turn these bytes into a derivative."""

    def __init__(self, code: ErrorCode, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else str(code))
        self.code = code
        self.detail = detail


class StorageError(DarkroomError):
    """Base class of object-store failures."""


class StorageUnavailable(StorageError):
    """A transient store fault: 5xx, throttling, timeout, refused connection."""


class ObjectMissing(StorageError):
    """The key, or that exact version of it, does not exist."""


class StorageConfigError(StorageError):
    """The store cannot be used as configured (e.g. bucket versioning not Enabled)."""
