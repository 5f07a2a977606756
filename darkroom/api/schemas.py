"""The JSON shapes of the HTTP API (DESIGN §4); the OpenAPI document is built from these."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, field_validator
from pydantic_core import core_schema

from darkroom.card import Card as CardRow
from darkroom.card import Priority
from darkroom.card import Status as CardStatus
from darkroom.errors import ErrorCode

# What the API accepts to store. The worker sniffs the real format from the bytes; this
# is only a first, cheap filter on what the client says it is sending.
ACCEPTED_TYPES = (
    "image/jpeg", "image/png", "image/webp", "image/gif",
    "image/heic", "image/heif", "image/avif", "image/tiff",
)
ImageType = Literal[
    "image/jpeg", "image/png", "image/webp", "image/gif",
    "image/heic", "image/heif", "image/avif", "image/tiff",
]
DerivativeSize = Literal["preview", "thumb"]


def _one_of(*members: StrEnum) -> GetPydanticSchema:
    """A string that is one of these members' values. Inline in the OpenAPI document, as
    a Literal is: an Enum type would become a schema of its own, documented by its
    docstring."""
    values = [str(m) for m in members]
    return GetPydanticSchema(lambda _type, _handler: core_schema.literal_schema(values))


# A card's states as its owner sees them: a card being deleted is already gone.
Status = Annotated[str, _one_of(*(s for s in CardStatus if s is not CardStatus.DELETING))]
PriorityName = Annotated[str, _one_of(*Priority)]
ErrorCodeName = Annotated[str, _one_of(*ErrorCode)]

MAX_FILENAME = 255
MAX_VERSION = 1024


def _printable(value: str, what: str) -> str:
    # PostgreSQL text cannot hold NUL, and control characters in a name are never meant.
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{what} must not contain control characters")
    return value


class NewFile(BaseModel):
    # Strict: a JSON string is not silently taken for the integer `size`.
    model_config = ConfigDict(strict=True)

    filename: str = Field(
        min_length=1,
        max_length=MAX_FILENAME,
        description="The original file name, for display only.",
    )
    # An enum in the schema, so a type we do not take is a plain 422 naming this field.
    content_type: ImageType = Field(description="The media type of the original.")
    size: int = Field(ge=1, description="The size in bytes the client is about to upload.")
    priority: PriorityName = Field(
        Priority.INTERACTIVE.value,
        description="interactive (default): someone is waiting for it; bulk: claimed only "
        "when no interactive card waits (imports, re-derives). Owners share the workers "
        "fairly within each priority.",
    )
    sha256: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description=(
            "The SHA-256 of the bytes (lowercase hex), optional. When the owner already has"
            " a live card whose confirmed original has this digest, the answer is that card"
            " (`200`, `duplicate_of`) and nothing is uploaded. Confirm hashes the stored"
            " bytes and refuses them (`422 digest_mismatch`) unless they have this digest."
        ),
    )
    allow_duplicate: bool = Field(
        default=False,
        description="With `sha256`: make a new card even if the archive has these bytes.",
    )

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        return _printable(value, "filename")


class Confirm(BaseModel):
    model_config = ConfigDict(strict=True)

    version: str = Field(
        min_length=1,
        max_length=MAX_VERSION,
        description="The version id the store gave the upload.",
    )

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        return _printable(value, "version")


class Upload(BaseModel):
    method: str
    url: str
    headers: dict[str, str]


class Derivative(BaseModel):
    url: str
    width: int | None
    height: int | None
    bytes: int | None
    sha256: str


class Derivatives(BaseModel):
    preview: Derivative = Field(description="At most 2048 px on the long edge.")
    thumb: Derivative = Field(
        description="At most 400 px on the long edge. Cards derived before thumbnails "
        "existed answer their preview here until they are derived again."
    )


class Card(BaseModel):
    id: uuid.UUID
    status: Status
    error_code: str | None
    attempts: int
    created_at: datetime
    updated_at: datetime
    filename: str
    content_type: str
    size: int
    priority: PriorityName
    derivative: Derivative | None = Field(description="The preview (kept for older clients).")
    derivatives: Derivatives | None
    thumbhash: str | None = Field(
        description="A ThumbHash placeholder (base64, at most 36 characters) to paint "
        "before the thumb loads."
    )
    rederive_error: str | None = Field(
        default=None,
        description="Why the last re-derive of this ready card failed (an error code); "
        "the card kept its previous derivative. Null once a re-derive succeeds.",
    )


class NewCard(Card):
    upload: Upload
    uploaded_version: str | None = Field(
        default=None,
        description=(
            "Only when a create is repeated with its Idempotency-Key while the card is"
            " pending: the store already holds a complete upload of this version; confirm"
            " it instead of uploading again (confirm still checks its digest)."
        ),
    )


class KnownCard(Card):
    """A create that needs no upload: the card a repeated Idempotency-Key made, or (with
    `duplicate_of`) the owner's live card that already has these bytes."""

    duplicate_of: uuid.UUID | None = Field(
        default=None,
        description="The id of the owner's card that already has these bytes (this card).",
    )


class CardList(BaseModel):
    items: list[Card]
    next_cursor: str | None


class Stored(BaseModel):
    version: str


class PriorityBacklog(BaseModel):
    waiting: int
    oldest_wait_seconds: float | None


class OwnerBacklog(BaseModel):
    owner: str
    waiting: int
    interactive: int
    bulk: int
    oldest_wait_seconds: float | None


class Backlog(BaseModel):
    by_priority: dict[str, PriorityBacklog]
    owners_waiting: int
    top_owners: list[OwnerBacklog] = Field(
        description="The owners with the most waiting cards (at most 10), most first.")


class QueueStats(BaseModel):
    counts: dict[str, int]
    oldest_claimable_age_seconds: float | None
    expired_leases: int
    rejected_share_1h: float | None
    rejected_share_24h: float | None
    completed_last_minute: int
    lease_lost_total: int
    backlog: Backlog
    rederive_pending: int
    # Workers that stopped claiming because the object store is failing.
    paused_workers: list[str] = Field(default_factory=list)
    claim_pauses: list[ClaimPause] = Field(
        default_factory=list, description="An operator's pauses of claiming in force.")
    claim_pause_log: list[PauseEvent] = Field(
        default_factory=list, description="The latest pauses and resumes (10), newest first.")
    rejected_by_code: dict[str, int] = Field(
        default_factory=dict, description="Rejected cards per error code.")


class ClaimPause(BaseModel):
    owner: str | None = Field(description="Only this owner's cards; null: every owner's.")
    priority: PriorityName | None = Field(description="Only this priority; null: both.")
    paused_by: str = Field(description="Who asked: `api:OWNER` of an admin key, or "
                           "`cli:USER@HOST`.")
    since: datetime


class PauseEvent(BaseModel):
    kind: Literal["paused", "resumed"]
    owner: str | None
    priority: PriorityName | None
    actor: str = Field(description="Who asked (as `paused_by`).")
    at: datetime


class PauseScope(BaseModel):
    """Which cards a pause covers: an owner's, a priority's, both, or (empty) every card."""

    model_config = ConfigDict(strict=True, extra="forbid")

    owner: str | None = Field(default=None, min_length=1, max_length=200)
    priority: PriorityName | None = None

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str | None) -> str | None:
        return None if value is None else _printable(value, "owner")


class ResumeScope(PauseScope):
    all: bool = Field(default=False, description="Lift every pause, whatever its scope.")


class Paused(BaseModel):
    pause: ClaimPause = Field(description="The pause in force for this scope.")
    changed: bool = Field(description="false: it was already paused (by `paused_by`).")


class Resumed(BaseModel):
    resumed: list[ClaimPause] = Field(description="The pauses lifted (none on a repeat).")


class RetryPicked(BaseModel):
    """The cards an admin picked in the console to queue again, any owner's."""

    model_config = ConfigDict(extra="forbid")

    ids: list[uuid.UUID] = Field(min_length=1, max_length=500,
                                 description="At most 500 card ids; a repeated id counts once.")


class PickedOutcome(BaseModel):
    id: uuid.UUID
    outcome: Literal["queued", "not_retryable", "not_rejected", "not_found"] = Field(
        description="queued: queued again now; not_retryable: rejected for the file's own "
        "fault; not_rejected: not rejected (already queued again, processing or ready); "
        "not_found: no such card.")
    status: str | None = Field(description="The card's status now (null: not found).")


class RetriedPicked(BaseModel):
    results: list[PickedOutcome] = Field(description="One per id, in the order given.")
    queued: int = Field(description="How many were queued again by this request.")


class HistoryEvent(BaseModel):
    kind: str = Field(description="claimed, ready, retry_scheduled, rejected, exhausted, "
                      "deferred, released, lease_lost, revoked, expired, rederive, ...")
    at: datetime
    attempt: int | None
    worker: str | None = Field(description="The worker's name: admin keys only (null "
                               "for the owner's own key).")
    error_code: str | None
    duration_seconds: float | None = Field(
        description="On the event that ended an attempt: the time since its claim.")


class History(BaseModel):
    items: list[HistoryEvent] = Field(description="Oldest first.")
    next_cursor: str | None


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class FieldError(BaseModel):
    field: str
    message: str


class ProblemDoc(BaseModel):
    """RFC 9457 problem details, as every error of this API answers them."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    errors: list[FieldError] | None = None


def card_from_row(row: CardRow) -> Card:
    derivative = derivatives = None
    # Also while a re-derive is on its way: the previous derivative is still served.
    # (The fenced commit writes a derivative's key and digest together.)
    if (row.derived_key is not None and row.sha256 is not None
            and row.status is not CardStatus.DELETING):
        derivative = Derivative(
            url=f"/v1/files/{row.id}/derivative",
            width=row.width,
            height=row.height,
            bytes=row.derived_bytes,
            sha256=row.sha256,
        )
        thumb = derivative
        if row.thumb_key is not None and row.thumb_sha256 is not None:
            thumb = Derivative(
                url=f"/v1/files/{row.id}/derivative?size=thumb",
                width=row.thumb_width,
                height=row.thumb_height,
                bytes=row.thumb_bytes,
                sha256=row.thumb_sha256,
            )
        derivatives = Derivatives(preview=derivative, thumb=thumb)
    return Card(
        id=row.id,
        status=row.status,
        error_code=row.error_code,
        attempts=row.attempts,
        created_at=row.created_at,
        updated_at=row.updated_at,
        filename=row.filename,
        content_type=row.content_type,
        size=row.size_bytes,
        priority=row.priority,
        derivative=derivative,
        derivatives=derivatives,
        thumbhash=row.thumbhash if derivatives is not None else None,
        rederive_error=row.rederive_error,
    )


def json_answer(model: BaseModel, status: int, headers: dict[str, str] | None = None) -> Response:
    """`model` as the answer. Serialized by pydantic-core in one step: the hot routes answer
    cards, and a Response skips FastAPI's second validation of a model built from our own
    row."""
    return Response(model.model_dump_json(), status_code=status, headers=headers,
                    media_type="application/json")


# The cursor is opaque to clients: the (created_at, id) of the last card of a page.
def encode_cursor(created_at: datetime, file_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(file_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Raises ValueError for anything this API did not hand out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, file_id = json.loads(raw)
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("naive timestamp")
        return when, uuid.UUID(file_id)
    except (binascii.Error, UnicodeDecodeError, TypeError, AttributeError) as exc:
        raise ValueError("invalid cursor") from exc
    except ValueError as exc:
        raise ValueError("invalid cursor") from exc


# A history's cursor: the id of the last event of a page, opaque to clients.
def encode_event_cursor(event_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps(["e", event_id]).encode()).decode().rstrip("=")


def decode_event_cursor(cursor: str) -> int:
    """Raises ValueError for anything this API did not hand out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tag, event_id = json.loads(raw)
    except (binascii.Error, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise ValueError("invalid cursor") from exc
    if tag != "e" or type(event_id) is not int or not 0 <= event_id < 2**63:
        raise ValueError("invalid cursor")
    return event_id
