"""A card: one row of `archive_files`, one per file (DESIGN §2), and its history.

The statements that answer cards (`db/queries.sql`, `db/uploads.sql`) name the card's
columns, the fields of `Card`, and a card is built from them by name. Named, not `*`:
migrations only add, and a running process must keep reading (and its prepared
statements keep answering) the same columns after the next one. Only `queue.py` changes
a card's status.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

__all__ = ["CARD_COLUMNS", "STATUSES", "Card", "Event", "HistoryEntry", "PendingCard", "Priority",
           "Status"]


class Status(StrEnum):
    """A card's states (DESIGN §2), as the schema's CHECK constraint lists them."""

    PENDING = "pending"
    QUEUED = "queued"
    PROCESSING = "processing"
    READY = "ready"
    REJECTED = "rejected"
    DELETING = "deleting"


STATUSES = tuple(str(s) for s in Status)


class Priority(StrEnum):
    """Which class a card waits in: every due interactive card is claimed before any
    bulk one; within a class, owners share the workers fairly (DESIGN §3.13)."""

    INTERACTIVE = "interactive"  # API uploads: someone is watching
    BULK = "bulk"  # `darkroom import --bulk`, `darkroom rederive`


@dataclass(frozen=True, slots=True)
class Card:
    """One file as its owner and the tools see it. The lease and the queue's bookkeeping
    (`lease_token`, `available_at`, `fair_stamp`, ...) stay in the protocol's statements."""

    id: uuid.UUID
    owner: str
    filename: str
    content_type: str
    size_bytes: int
    original_key: str
    original_version: str | None
    # The digest the client claimed at create; confirm moves the card only if it holds.
    original_sha256: str | None
    status: Status
    priority: Priority
    attempts: int
    error_code: str | None
    # The preview: set by the fenced commit, kept while a re-derive is on its way.
    derived_key: str | None
    derived_version: str | None
    sha256: str | None
    width: int | None
    height: int | None
    derived_bytes: int | None
    # The thumb (≤ 400 px), published with the preview; None for cards derived before it.
    thumb_key: str | None
    thumb_version: str | None
    thumb_sha256: str | None
    thumb_width: int | None
    thumb_height: int | None
    thumb_bytes: int | None
    thumbhash: str | None
    # Why the last re-derive failed (a public code): the card stayed ready with its
    # previous derivative. Cleared when a re-derive publishes.
    rederive_error: str | None
    created_at: datetime
    updated_at: datetime

    def __post_init__(self) -> None:
        # The columns are text (CHECK-constrained): the row gives strings.
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "priority", Priority(self.priority))

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> Card:
        """The card among the columns of a row that carries more (confirm's answer)."""
        return cls(**{name: row[name] for name in CARD_COLUMNS})


CARD_COLUMNS = tuple(f.name for f in fields(Card))


@dataclass(frozen=True, slots=True)
class PendingCard:
    """A card left pending past the TTL, as the sweeper checks the store for its upload."""

    id: uuid.UUID
    owner: str
    original_key: str
    size_bytes: int
    original_sha256: str | None


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a file's history (`archive_events`), written by the statement whose
    change it records."""

    id: int
    file_id: uuid.UUID
    kind: str
    attempt: int | None
    token: uuid.UUID | None
    worker: str | None
    error_code: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of a card's history as people read it (`file_history`): no lease token,
    and the attempt's duration on the event that ended it."""

    id: int
    kind: str
    attempt: int | None
    worker: str | None
    error_code: str | None
    created_at: datetime
    # From the attempt's claim to this event; None for a claim and for events of no attempt.
    duration_seconds: float | None
