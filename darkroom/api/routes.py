"""The /v1 routes of DESIGN §4, plus /metrics, /healthz and /readyz.

Every card lookup is by (id, owner): another owner's file and a missing one take the same
path through the code and answer the same 404, so nothing tells them apart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, BinaryIO, cast

from anyio import to_thread
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse

from darkroom import stats
from darkroom.api.auth import Admin, Caller, admin, bearer, principal
from darkroom.api.events import Hub
from darkroom.api.limits import RateLimiter
from darkroom.api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from darkroom.api.metrics import render
from darkroom.api.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    invalid_field,
    not_found,
    problem_response,
)
from darkroom.api.schemas import (
    ACCEPTED_TYPES,
    Card,
    CardList,
    ClaimPause,
    Confirm,
    DerivativeSize,
    ErrorCodeName,
    Health,
    History,
    HistoryEvent,
    KnownCard,
    NewCard,
    NewFile,
    Paused,
    PauseScope,
    QueueStats,
    Resumed,
    ResumeScope,
    RetriedPicked,
    RetryPicked,
    Status,
    Stored,
    Upload,
    card_from_row,
    decode_cursor,
    decode_event_cursor,
    encode_cursor,
    encode_event_cursor,
)
from darkroom.card import Card as CardRow
from darkroom.card import Priority
from darkroom.card import Status as CardStatus
from darkroom.config import Settings
from darkroom.db.database import Database
from darkroom.errors import ObjectMissing, StorageError, StorageUnavailable
from darkroom.keys import find_key_hash, key_name
from darkroom.pauses import ClaimPause as PauseRow
from darkroom.pauses import pause_claims as make_pause
from darkroom.pauses import resume_claims as lift_pauses
from darkroom.queue import Confirmation, ConfirmOutcome, Queue, QuotaExceeded, original_key
from darkroom.reads import Reads
from darkroom.retry import RetryOutcome, retry_card, retry_picked
from darkroom.storage import ObjectInfo, ObjectStore
from darkroom.uploads import KeyBusy, KeyReused, valid_key

log = logging.getLogger(__name__)

# Request bodies up to this size stay in memory while spooled; larger ones go to disk.
_SPOOL_MEMORY = 1024 * 1024
# An upload URL never outlives its card's guard interval: a URL still valid after the
# sweeper purged a deleted card would let bytes land that no card accounts for.
_PRESIGN_PUT_SECONDS = 900
_PRESIGN_GET_SECONDS = 300
_READY_TIMEOUT = 3.0


# Readiness checks given up on, still finishing: held so they are not collected mid-way.
_ABANDONED: set[asyncio.Task[None]] = set()


async def _within(check: Coroutine[Any, Any, None], seconds: float) -> None:
    """`check`, or TimeoutError after `seconds` even if cancelling it takes longer.

    asyncio.wait_for waits for the cancelled check to end, and cancelling a statement to
    a partitioned server waits on that server too (measured: 13 s instead of 3). The
    probe answers on time; the abandoned check ends on its own.
    """
    task = asyncio.ensure_future(check)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        _ABANDONED.add(task)
        task.add_done_callback(_ABANDONED.discard)
        raise TimeoutError
    task.result()


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


_DESCRIPTIONS = {
    401: "No API key, or not a valid one.",
    403: "The key is valid but not allowed here.",
    404: "No such file (or it belongs to another owner).",
    409: "The file is not in a state that allows this.",
    413: "Larger than the upload limit.",
    422: "The request is not valid; `errors` names the fields.",
    429: "Too many requests; `Retry-After` says when to try again.",
    503: "The database or the object store is unavailable.",
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem answers a route can give."""
    return {status: _problem(_DESCRIPTIONS[status]) for status in (*statuses, 503)}


router = APIRouter()

# Declared a UUID in the schema, taken as any string: a malformed id is answered like an
# id that does not exist (404), not as a validation error.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=(
            "Makes the create safe to retry: the same key from the same owner with the same"
            " body answers the card the first request made (for at least 24 hours); the"
            " same key with a different body answers 422 (`idempotency_key_reused`)."
        ),
    ),
]

FileId = Annotated[
    str, Path(description="The card's id (a UUID).", json_schema_extra={"format": "uuid"})
]


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def _reads(request: Request) -> Reads:
    reads: Reads = request.app.state.reads
    return reads


def _db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def _store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _file_id(raw: str) -> uuid.UUID:
    # A malformed id is just an id that does not exist: 404, not a validation error.
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise not_found() from None


async def _card_row(request: Request, raw_id: str, owner: str) -> CardRow:
    row = await _reads(request).get_file(_file_id(raw_id), owner)
    if row is None:
        raise not_found()
    return row


async def _head(request: Request, key: str, version: str) -> ObjectInfo:
    """The named version of a card's original."""
    store = _store(request)
    if store.inline_head:
        return store.head(key, version)
    return await to_thread.run_sync(lambda: store.head(key, version))


_background_tasks: set[asyncio.Task[None]] = set()


def _background(request: Request, work: Callable[[], None]) -> None:
    """Run blocking clean-up `work` in a thread after the answer; the task is held so it
    is not collected half-way."""
    task = asyncio.get_running_loop().create_task(to_thread.run_sync(work))
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


def _conflict() -> Problem:
    return Problem(409, "conflict", "The file was already confirmed with another version.")


def _too_large(limit: int) -> Problem:
    return Problem(
        413,
        "payload_too_large",
        f"The file is larger than the upload limit of {limit} bytes.",
        limit=limit,
    )


def _card_json(card: Card, status: int, headers: dict[str, str] | None = None) -> Response:
    # Serialized by pydantic-core in one step: the hot routes answer cards, and a
    # Response skips FastAPI's second validation of a model built from our own row.
    return Response(card.model_dump_json(), status_code=status, headers=headers,
                    media_type="application/json")


# --- files -------------------------------------------------------------------------------


@router.post(
    "/v1/files",
    status_code=201,
    response_model=NewCard,
    tags=["files"],
    responses={
        200: {
            "description": (
                "No upload needed: the card a repeated Idempotency-Key made (already"
                " confirmed), or the owner's card that has these bytes (`duplicate_of`)."
            ),
            "model": KnownCard,
        },
        **problems(401, 403, 409, 413, 422, 429),
    },
    summary="Create a card and get upload instructions",
)
async def create_file(
    body: NewFile, who: Caller, request: Request, idempotency_key: IdempotencyKey = None
) -> Response:
    settings = _settings(request)
    if body.size > settings.max_upload_bytes:
        raise _too_large(settings.max_upload_bytes)
    limiter: RateLimiter = request.app.state.creations
    wait = limiter.spend(getattr(request.state, "key_hash", who.owner))
    if wait:
        raise Problem(429, "too_many_requests", "Too many files created with this key; "
                      "try again later.", headers={"Retry-After": str(wait)})
    if body.sha256 is not None or idempotency_key is not None:
        return await _create_once(body, who.owner, request, idempotency_key)
    try:
        row = await _queue(request).create_file(
            owner=who.owner, filename=body.filename, content_type=body.content_type,
            size=body.size, quota_files=settings.owner_quota_files,
            quota_bytes=settings.owner_quota_bytes, priority=Priority(body.priority),
        )
    except QuotaExceeded:
        raise _quota_exceeded(settings) from None
    upload = await _upload_instructions(request, row)
    card = NewCard(**card_from_row(row).model_dump(), upload=upload)
    return _card_json(card, 201, {"Location": f"/v1/files/{row.id}"})


def _quota_exceeded(settings: Settings) -> Problem:
    return Problem(403, "quota_exceeded",
                   "This file would take the owner past its storage quota.",
                   quota_files=settings.owner_quota_files or None,
                   quota_bytes=settings.owner_quota_bytes or None)


async def _upload_instructions(request: Request, row: CardRow) -> Upload:
    content_type = row.content_type
    presigned = await to_thread.run_sync(
        lambda: _store(request).presign_put(
            row.original_key, content_type=content_type,
            expires=max(1, min(_PRESIGN_PUT_SECONDS,
                               int(_settings(request).sweep_guard_seconds))),
            size=row.size_bytes,
        )
    )
    if presigned is not None:
        return Upload(method=presigned.method, url=presigned.url, headers=dict(presigned.headers))
    # The local store: the API takes the bytes itself (send the bearer key along). The URL
    # is relative, or on the configured public origin: never built from the request's
    # Host header, which the client chooses.
    url = f"{_settings(request).public_url or ''}/v1/files/{row.id}/content"
    return Upload(method="PUT", url=url, headers={"Content-Type": content_type})


# What makes two creates "the same request" for an Idempotency-Key: what the card is and
# what the client asked about it. Scheduling hints (`darkroom import --bulk`) are not in
# it, so the same file sent again with another hint is still the same create.
FINGERPRINT = ("filename", "content_type", "size", "sha256", "allow_duplicate")


async def _create_once(
    body: NewFile, owner: str, request: Request, idempotency_key: str | None
) -> Response:
    """A create with an Idempotency-Key or a sha256 (darkroom/uploads.py)."""
    if idempotency_key is not None and not valid_key(idempotency_key):
        raise invalid_field("Idempotency-Key", "1 to 255 printable ASCII characters")
    try:
        created = await request.app.state.uploads.create(
            _queue(request), owner=owner, filename=body.filename,
            content_type=body.content_type, size=body.size, sha256=body.sha256,
            allow_duplicate=body.allow_duplicate, key=idempotency_key,
            fields=body.model_dump(mode="json", include=set(FINGERPRINT)),
            priority=Priority(body.priority),
            quota_files=_settings(request).owner_quota_files,
            quota_bytes=_settings(request).owner_quota_bytes,
        )
    except QuotaExceeded:
        raise _quota_exceeded(_settings(request)) from None
    except KeyReused:
        raise Problem(
            422, "idempotency_key_reused",
            "This Idempotency-Key was already used with a different request.",
        ) from None
    except KeyBusy:
        raise Problem(409, "conflict", "The request is in progress; try again.") from None
    row = created.card
    headers = {"Location": f"/v1/files/{row.id}"}
    if created.replayed:
        headers["Idempotent-Replayed"] = "true"
    if created.duplicate:
        known = KnownCard(**card_from_row(row).model_dump(), duplicate_of=row.id)
        return _card_json(known, 200, headers)
    if row.status is not CardStatus.PENDING:  # repeated after the card was confirmed
        return _card_json(card_from_row(row), 200, headers)
    uploaded = None
    if created.replayed and row.original_sha256 is not None:
        uploaded = await _complete_upload(request, row)
    upload = await _upload_instructions(request, row)
    card = NewCard(**card_from_row(row).model_dump(), upload=upload, uploaded_version=uploaded)
    return _card_json(card, 201, headers)


async def _complete_upload(request: Request, row: CardRow) -> str | None:
    """The newest stored version of a pending card's original when it has the declared
    size: the client that made it may have been cut off before it could confirm."""
    store = _store(request)
    key = row.original_key

    def newest() -> str | None:
        for obj in store.list(key):
            if obj.key == key:  # versions of one key come newest first
                return obj.version if obj.size == row.size_bytes else None
        return None

    try:
        return await to_thread.run_sync(newest)
    except StorageError:  # down, or no permission to list versions
        return None  # the client simply uploads again


@router.put(
    "/v1/files/{file_id}/content",
    response_model=Stored,
    tags=["files"],
    responses=problems(401, 404, 409, 413, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            # The bytes are stored as they come, under the card's declared content type.
            "content": {
                media_type: {"schema": {"type": "string", "format": "binary"}}
                for media_type in (*ACCEPTED_TYPES, "application/octet-stream")
            },
        }
    },
    summary="Upload the original through the API",
)
async def put_content(file_id: FileId, who: Caller, request: Request) -> Stored:
    row = await _card_row(request, file_id, who.owner)
    if row.status is not CardStatus.PENDING:
        raise Problem(409, "conflict", "The file was already confirmed.")
    limit = _settings(request).max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    # Spooled: a small body stays in memory, a big one goes to a temporary file, and the
    # count stops the upload as soon as it passes the limit, whatever the client declared.
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY) as spool:
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise _too_large(limit)
            spool.write(chunk)
        if received == 0:
            raise invalid_field("body", "the upload is empty")
        if received != row.size_bytes:
            raise _size_mismatch()
        spool.seek(0)
        store = _store(request)
        key = row.original_key
        version = await to_thread.run_sync(
            lambda: store.put(key, cast(BinaryIO, spool), content_type=row.content_type)
        )
    log.info("original stored", extra={"file_id": str(row.id), "bytes": received})
    # A pending card keeps only its latest upload: the earlier ones can never be confirmed
    # usefully, and would otherwise let one card fill the store.
    await to_thread.run_sync(lambda: _drop_versions(store, key, older_than=version))
    return Stored(version=version)


def _size_mismatch() -> Problem:
    return invalid_field("version", "the upload's size is not the size the card declared",
                         slug="size_mismatch",
                         detail="The upload's size differs from the declared size.")


def _drop_versions(store: ObjectStore, key: str, *, older_than: str | None = None,
                   keep: str | None = None) -> None:
    """Delete the versions of `key` older than `older_than`, or every one but `keep`.

    Best effort: what a failure leaves goes with the card when it is deleted or expires.
    """
    try:
        versions = [v.version for v in store.list(key) if v.key == key]  # newest first
        if older_than is not None:
            if older_than not in versions:
                return
            doomed = versions[versions.index(older_than) + 1:]
        else:
            doomed = [v for v in versions if v != keep]
        for version in doomed:
            store.delete(key, version)
    except StorageError as exc:
        log.warning("superseded upload not deleted", extra={"key": key,
                                                            "error": type(exc).__name__})


def _drop_version(store: ObjectStore, key: str, version: str) -> None:
    try:
        store.delete(key, version)
    except StorageError as exc:
        log.warning("refused upload not deleted", extra={"key": key,
                                                         "error": type(exc).__name__})


@router.post(
    "/v1/files/{file_id}/confirm",
    status_code=202,
    response_model=Card,
    tags=["files"],
    responses=problems(401, 404, 409, 413, 422),
    summary="Queue the card for exactly this version of the original",
)
async def confirm(file_id: FileId, body: Confirm, who: Caller, request: Request) -> Response:
    fid = _file_id(file_id)
    queue = _queue(request)
    limit = _settings(request).max_upload_bytes
    location = {"Location": f"/v1/files/{fid}"}
    # The common case takes two steps and never reads the card first: the named version
    # exists and fits, then one statement checks owner and status, moves the card and
    # answers it. The key is the one a card of this owner gets; a card made before owners
    # were in the key has another, found on the card when the first look misses.
    key = original_key(fid, who.owner)
    try:
        info: ObjectInfo | None = await _head(request, key, body.version)
    except (ObjectMissing, StorageUnavailable):
        info = None
    if info is None or info.size > limit:
        # Decided from the card: a repeat stays idempotent even if the original has since
        # gone (the worker will report that as original_missing) or the store is down.
        row = await _card_row(request, file_id, who.owner)
        if row.status is not CardStatus.PENDING:
            if row.original_version == body.version:
                return _card_json(card_from_row(row), 202, location)
            raise _conflict()
        key = row.original_key
        if info is None:
            try:  # again, for the precise answer: 422 for a missing version, 503 for an outage
                info = await _head(request, key, body.version)
            except ObjectMissing:
                raise invalid_field("version", "no such version", slug="version_not_found",
                                    detail="No upload with this version exists.") from None
        if info.size > limit:
            # Refused for good: its bytes go now, not with the card.
            await to_thread.run_sync(
                lambda: _drop_version(_store(request), key, body.version))
            raise _too_large(limit)
    done = await queue.confirm_card(fid, who.owner, body.version, size=info.size)
    if done.outcome is ConfirmOutcome.DIGEST_REQUIRED and done.claimed_sha256 is not None:
        done = await _confirm_digest(request, fid, who.owner, key, body.version,
                                     done.claimed_sha256, info.size)
    outcome, fresh = done.outcome, done.card
    if outcome is ConfirmOutcome.NOT_FOUND:
        raise not_found()
    if outcome is ConfirmOutcome.CONFLICT:
        raise _conflict()
    if outcome is ConfirmOutcome.SIZE_MISMATCH:
        await to_thread.run_sync(
            lambda: _drop_version(_store(request), key, body.version))
        raise _size_mismatch()
    if outcome is ConfirmOutcome.QUEUED and not _store(request).inline_head:
        # Only the confirmed version is kept: a presigned URL may have been used more than
        # once. Off the answer's path, since the card is already queued. (The local store
        # takes uploads only through put_content, which already keeps just the latest.)
        _background(request, lambda: _drop_versions(_store(request), key,
                                                    keep=body.version))
    if fresh is None:  # confirmed before with this version (maybe concurrently): as it is now
        fresh = await _reads(request).get_file(fid, who.owner)
        if fresh is None:  # deleted in between
            raise not_found()
    return _card_json(card_from_row(fresh), 202, location)


async def _confirm_digest(
    request: Request, fid: uuid.UUID, owner: str, key: str, version: str, claimed: str,
    size: int
) -> Confirmation:
    """The card claimed a digest at create: hash the stored bytes, and confirm only if
    they are the claimed ones. Only cards created with a `sha256` pay for this read."""
    store = _store(request)
    try:
        actual = await to_thread.run_sync(lambda: store.digest(key, version))
    except ObjectMissing:
        raise invalid_field("version", "no such version", slug="version_not_found",
                            detail="No upload with this version exists.") from None
    if actual != claimed:
        # Refused, and the refused bytes go: the card stays pending for a right upload.
        try:
            await to_thread.run_sync(lambda: store.delete(key, version))
        except StorageError as exc:  # down, or no permission to delete versions
            log.warning("refused upload not deleted",
                        extra={"file_id": str(fid), "error": type(exc).__name__})
        log.info("upload refused: digest mismatch", extra={"file_id": str(fid)})
        raise Problem(
            422, "digest_mismatch",
            "The uploaded bytes do not have the sha256 given when the file was created.",
        )
    return await _queue(request).confirm_card(fid, owner, version, sha256=actual, size=size)


@router.get(
    "/v1/files/{file_id}",
    response_model=Card,
    tags=["files"],
    responses=problems(401, 404),
    summary="One card",
)
async def get_file(file_id: FileId, who: Caller, request: Request) -> Response:
    return _card_json(card_from_row(await _card_row(request, file_id, who.owner)), 200)


@router.get(
    "/v1/files",
    response_model=CardList,
    tags=["files"],
    responses=problems(401, 422),
    summary="The caller's cards, newest first",
)
async def list_files(
    who: Caller,
    request: Request,
    status: Annotated[Status | None, Query(description="Only cards in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=300, description="`next_cursor` of the previous page.")
    ] = None,
    code: Annotated[
        ErrorCodeName | None, Query(description="Only cards with this error code.")
    ] = None,
    all_owners: Annotated[
        bool, Query(description="Every owner's cards (admin key, with `status=rejected`): "
                    "the console's rejected cards.")
    ] = False,
) -> CardList:
    after = None
    if cursor is not None:
        try:
            after = decode_cursor(cursor)
        except ValueError:
            raise invalid_field("cursor", "not a cursor of this API") from None
    if all_owners:
        if not who.admin:
            raise Problem(403, "forbidden", "This needs an admin key.")
        if status != CardStatus.REJECTED:
            raise invalid_field("status", "all_owners lists rejected cards only")
        rows = await _reads(request).list_rejected(code=code, limit=limit + 1, after=after)
    else:
        rows = await _reads(request).list_files(
            who.owner, status=None if status is None else CardStatus(status),
            limit=limit + 1, after=after, code=code)
    page = rows[:limit]
    next_cursor = (
        encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    )
    return CardList(items=[card_from_row(r) for r in page], next_cursor=next_cursor)


@router.get(
    "/v1/files/{file_id}/events",
    response_model=History,
    tags=["files"],
    responses=problems(401, 404, 422),
    summary="A card's history, oldest first (an admin key: any owner's card)",
)
async def file_events(
    file_id: FileId,
    who: Caller,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[
        str | None, Query(max_length=100, description="`next_cursor` of the previous page.")
    ] = None,
) -> History:
    after = None
    if cursor is not None:
        try:
            after = decode_event_cursor(cursor)
        except ValueError:
            raise invalid_field("cursor", "not a cursor of this API") from None
    rows = await _reads(request).history(
        _file_id(file_id), None if who.admin else who.owner, limit=limit + 1, after=after)
    if rows is None:
        raise not_found()
    page = rows[:limit]
    return History(
        items=[HistoryEvent(kind=e.kind, at=e.created_at, attempt=e.attempt,
                            # Which machine ran it is the operator's business.
                            worker=e.worker if who.admin else None,
                            error_code=e.error_code, duration_seconds=e.duration_seconds)
               for e in page],
        next_cursor=encode_event_cursor(page[-1].id) if len(rows) > limit else None)


@router.get(
    "/v1/files/{file_id}/derivative",
    tags=["files"],
    responses={
        200: {
            "description": "The WebP (local store).",
            "content": {"image/webp": {"schema": {"type": "string", "format": "binary"}}},
        },
        304: {"description": "Not modified (If-None-Match matched the ETag)."},
        307: {"description": "A redirect to a short-lived URL of the WebP."},
        **problems(401, 404, 409, 422),
    },
    response_class=Response,
    summary="A WebP derivative: the preview (default) or the thumb",
)
async def derivative(
    file_id: FileId,
    who: Caller,
    request: Request,
    size: Annotated[
        DerivativeSize,
        Query(description="`preview` (≤ 2048 px) or `thumb` (≤ 400 px)."),
    ] = "preview",
) -> Response:
    row = await _card_row(request, file_id, who.owner)
    # A card being re-derived keeps serving its previous derivative until the new one is
    # published.
    # (The fenced commit writes an object's key and version together.)
    if row.derived_key is None or row.derived_version is None:
        raise Problem(409, "not_ready", f"The file is {row.status}, not ready.")
    store = _store(request)
    key, version, sha = row.derived_key, row.derived_version, row.sha256
    if size == "thumb" and row.thumb_key is not None and row.thumb_version is not None:
        # A card derived before thumbs existed falls through to its preview.
        key, version, sha = row.thumb_key, row.thumb_version, row.thumb_sha256
    url = await to_thread.run_sync(
        lambda: store.presign_get(key, version, expires=_PRESIGN_GET_SECONDS)
    )
    if url is not None:
        return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
    etag = f'"{sha}"'
    # Private: only the key's owner may see it. Revalidated (a 304 by ETag): a re-derive
    # replaces a card's derivative under the same URL.
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    try:
        data = await to_thread.run_sync(lambda: store.get(key, version))
    except ObjectMissing:
        # Ready but the bytes are gone: treat as missing rather than hint at internals.
        log.error("derivative object missing", extra={"file_id": str(row.id)})
        raise not_found() from None
    return Response(data, media_type="image/webp", headers=headers)


@router.get(
    "/v1/events",
    tags=["files"],
    responses={
        200: {
            "description": "A server-sent event stream: `open` once, then `status` "
            "(`{id, status}`) for each status change of the caller's cards, `resync` when "
            "changes may have been missed (re-read what you show), `ping` when idle, and "
            "`end` (`{reason}`) last when the server ends it: `max_age` or `revoked` "
            "(reconnect at once, then re-read), `replaced` (the owner opened a newer one "
            "past the per-owner limit: do not reconnect).",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problems(401),
    },
    response_class=StreamingResponse,
    summary="Status changes of the caller's cards, pushed",
)
async def events(who: Caller, request: Request) -> StreamingResponse:
    hub: Hub = request.app.state.hub
    db = request.app.state.db
    key_hash: str = request.state.key_hash

    async def still_valid() -> bool:
        found = await find_key_hash(db, key_hash)
        return found is not None and found.owner == who.owner

    return StreamingResponse(
        hub.stream(who.owner, still_valid),
        media_type="text/event-stream",
        # No proxy may buffer or cache a live stream.
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/v1/files/{file_id}/retry",
    status_code=202,
    response_model=Card,
    tags=["files"],
    responses=problems(401, 404, 409),
    summary="Queue a rejected card again, with a fresh attempt budget",
    description="Only a card rejected for a fault that was not the file's own "
    "(`storage_unavailable`, `processing_timeout`, `attempts_exhausted`); any other card "
    "answers `409 not_retryable`.",
)
async def retry_file(file_id: FileId, who: Caller, request: Request) -> Response:
    done = await retry_card(_queue(request), _file_id(file_id), who.owner,
                            _actor(request, who.owner))
    if done.outcome is RetryOutcome.NOT_FOUND:
        raise not_found()
    if done.outcome is RetryOutcome.NOT_RETRYABLE or done.card is None:
        raise Problem(409, "not_retryable",
                      "Only a file rejected for storage_unavailable, processing_timeout or "
                      "attempts_exhausted can be retried.")
    return _card_json(card_from_row(done.card), 202, {"Location": f"/v1/files/{done.card.id}"})


def _actor(request: Request, owner: str) -> str:
    """Who asked, for the card's history: the key by its listed prefix, and its owner."""
    _, _, key = request.headers.get("authorization", "").partition(" ")
    return f"api:{key_name(key.strip())} owner={owner}"


@router.delete(
    "/v1/files/{file_id}",
    status_code=202,
    tags=["files"],
    responses={202: {"description": "The card is being deleted."}, **problems(401, 404)},
    response_class=Response,
    summary="Delete a file",
)
async def delete_file(file_id: FileId, who: Caller, request: Request) -> Response:
    if not await _queue(request).revoke(_file_id(file_id), who.owner):
        raise not_found()
    return Response(status_code=202)


# --- operations --------------------------------------------------------------------------


@router.get(
    "/v1/queue",
    response_model=QueueStats,
    tags=["operations"],
    responses=problems(401, 403),
    summary="Queue health (admin key)",
)
async def queue_stats(who: Admin, request: Request) -> dict[str, Any]:
    return (await stats.read(_db(request))).to_json()


def _pause_json(p: PauseRow) -> ClaimPause:
    return ClaimPause(owner=p.owner, priority=p.priority, paused_by=p.paused_by,
                      since=p.since)


@router.post(
    "/v1/queue/pause",
    response_model=Paused,
    tags=["operations"],
    responses=problems(401, 403, 413, 422),
    summary="Stop every worker starting attempts on these cards (admin key)",
)
async def pause_claims(body: PauseScope, who: Admin, request: Request) -> Paused:
    pause, changed = await make_pause(
        _db(request), actor=f"api:{who.owner}", owner=body.owner,
        priority=None if body.priority is None else Priority(body.priority))
    if changed:
        log.info("claiming paused", extra={"scope": pause.scope(), "by": pause.paused_by})
    return Paused(pause=_pause_json(pause), changed=changed)


@router.post(
    "/v1/queue/resume",
    response_model=Resumed,
    tags=["operations"],
    responses=problems(401, 403, 413, 422),
    summary="Lift the pause of exactly these cards, or every pause (admin key)",
)
async def resume_claims(body: ResumeScope, who: Admin, request: Request) -> Resumed:
    if body.all and (body.owner is not None or body.priority is not None):
        raise invalid_field("all", "all takes no owner or priority")
    lifted = await lift_pauses(
        _db(request), actor=f"api:{who.owner}", owner=body.owner,
        priority=None if body.priority is None else Priority(body.priority), every=body.all)
    for p in lifted:
        log.info("claiming resumed", extra={"scope": p.scope(), "by": f"api:{who.owner}"})
    return Resumed(resumed=[_pause_json(p) for p in lifted])


@router.post(
    "/v1/queue/retry",
    response_model=RetriedPicked,
    tags=["operations"],
    responses=problems(401, 403, 413, 422),
    summary="Queue again the rejected cards picked in the console, any owner's (admin key)",
    description="At most 500 ids. Each card rejected for a fault that was not the file's "
    "own is queued again as bulk work; the answer says per id what became of it. Safe to "
    "repeat: a card already queued again answers `not_rejected` with its status.",
)
async def retry_picked_cards(body: RetryPicked, who: Admin, request: Request) -> RetriedPicked:
    done = await retry_picked(_queue(request), body.ids, _actor(request, who.owner))
    queued = sum(1 for d in done if d.outcome is RetryOutcome.QUEUED)
    if queued:
        log.info("rejected cards queued again", extra={"cards": queued, "by": who.owner})
    return RetriedPicked.model_validate({
        "results": [{"id": d.id, "outcome": str(d.outcome), "status": d.status}
                    for d in done],
        "queued": queued})


@router.get(
    "/metrics",
    tags=["operations"],
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problems(401, 403),
    },
    summary="Prometheus metrics (admin key, or the metrics listener)",
)
async def metrics(request: Request) -> Response:
    if not on_metrics_listener(request.scope):
        # On the API's port the figures are an admin's, as /v1/queue is.
        await admin(await principal(request, await bearer(request)))
    cache: StatsCache = request.app.state.stats_cache
    figures = await cache.get(_db(request))
    return Response(render(request.app.state.metrics, figures), media_type=METRICS_CONTENT_TYPE)


def on_metrics_listener(scope: Any) -> bool:
    """Whether the request came in on the metrics listener (`DARKROOM_API_METRICS_PORT`):
    the local address it reached, which the client cannot choose."""
    port = scope["app"].state.settings.api_metrics_port
    server = scope.get("server")
    return bool(port) and server is not None and server[1] == port


class StatsCache:
    """The queue gauges, read from the database at most once per `ttl` seconds however
    often /metrics is scraped (each read is a count over the whole queue)."""

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._at = -math.inf
        self._value: stats.QueueStats | None = None
        self._lock = asyncio.Lock()

    async def get(self, db: Database) -> stats.QueueStats | None:
        async with self._lock:  # concurrent scrapes share one read
            now = time.monotonic()
            if now - self._at < self.ttl:
                return self._value
            try:
                self._value = await asyncio.wait_for(stats.read(db), _READY_TIMEOUT)
            except Exception as exc:  # a scrape must still answer, with stats_up 0
                log.warning("queue stats unavailable for /metrics: %s", type(exc).__name__)
                self._value = None
            self._at = time.monotonic()
            return self._value


@router.get("/healthz", response_model=Health, tags=["operations"], summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    tags=["operations"],
    responses={503: _problem("The database or the object store is unreachable.")},
    summary="Readiness: database and object store reachable",
)
async def readyz(request: Request) -> Response:
    checks: dict[str, str] = {}

    async def database() -> None:
        await request.app.state.db.ping(_READY_TIMEOUT)

    async def storage() -> None:
        await to_thread.run_sync(_store(request).check)

    for name, probe in (("database", database), ("storage", storage)):
        try:
            await _within(probe(), _READY_TIMEOUT)
            checks[name] = "ok"
        except Exception as exc:
            log.warning(
                "readiness check failed", extra={"check": name, "error": type(exc).__name__}
            )
            checks[name] = "unavailable"
    if all(v == "ok" for v in checks.values()):
        return JSONResponse(Health(status="ready", checks=checks).model_dump())
    return problem_response(
        503, "not_ready_to_serve", "A dependency is unavailable.", checks=checks
    )
