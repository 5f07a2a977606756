"""The upload flow over HTTP (DESIGN §4): create a card, upload its original through the
API (a store that signs no URLs), confirm the version. The flow is `darkroom/files.py`;
these routes only translate its outcomes into answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, assert_never

from anyio import to_thread
from fastapi import APIRouter, Header, Request, Response

from darkroom import files
from darkroom.api.auth import Caller
from darkroom.api.deps import FileId, FilesDep, SettingsDep, file_uuid
from darkroom.api.limits import RateLimiter
from darkroom.api.problems import Problem, invalid_field, not_found, problems
from darkroom.api.schemas import (
    ACCEPTED_TYPES,
    Card,
    Confirm,
    KnownCard,
    NewCard,
    NewFile,
    Stored,
    Upload,
    card_from_row,
    json_answer,
)
from darkroom.card import Card as CardRow
from darkroom.card import Priority
from darkroom.card import Status as CardStatus
from darkroom.config import Settings
from darkroom.storage import PresignedRequest

router = APIRouter(tags=["files"])

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


# Clean-up running after its answer, held so it is not collected half-way.
_background: set[asyncio.Task[None]] = set()


def _after_answer(work: Callable[[], None]) -> None:
    """Run blocking clean-up `work` in a thread after the answer."""
    task = asyncio.get_running_loop().create_task(to_thread.run_sync(work))
    _background.add(task)
    task.add_done_callback(_background.discard)


def _too_large(limit: int) -> Problem:
    return Problem(413, "payload_too_large",
                   f"The file is larger than the upload limit of {limit} bytes.", limit=limit)


def _size_mismatch() -> Problem:
    return invalid_field("version", "the upload's size is not the size the card declared",
                         slug="size_mismatch",
                         detail="The upload's size differs from the declared size.")


def _version_not_found() -> Problem:
    return invalid_field("version", "no such version", slug="version_not_found",
                         detail="No upload with this version exists.")


def _upload(presigned: PresignedRequest | None, card: CardRow,
            settings: Settings) -> Upload:
    if presigned is not None:
        return Upload(method=presigned.method, url=presigned.url,
                      headers=dict(presigned.headers))
    # The local store: the API takes the bytes itself (send the bearer key along). The URL
    # is relative, or on the configured public origin: never built from the request's
    # Host header, which the client chooses.
    url = f"{settings.public_url or ''}/v1/files/{card.id}/content"
    return Upload(method="PUT", url=url, headers={"Content-Type": card.content_type})


@router.post(
    "/v1/files",
    status_code=201,
    response_model=NewCard,
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
    body: NewFile, who: Caller, flow: FilesDep, settings: SettingsDep, request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    limiter: RateLimiter = request.app.state.creations
    bucket = getattr(request.state, "key_hash", who.owner)
    new = files.NewUpload(filename=body.filename, content_type=body.content_type,
                          size=body.size, priority=Priority(body.priority),
                          sha256=body.sha256, allow_duplicate=body.allow_duplicate)
    made = await flow.create(who.owner, new, key=idempotency_key,
                             throttle=lambda: limiter.spend(bucket))
    match made:
        case files.Created(card, presigned):
            answer = NewCard(**card_from_row(card).model_dump(),
                             upload=_upload(presigned, card, settings))
            return json_answer(answer, 201, {"Location": f"/v1/files/{card.id}"})
        case files.Replayed(card, presigned, uploaded):
            headers = {"Location": f"/v1/files/{card.id}", "Idempotent-Replayed": "true"}
            if card.status is not CardStatus.PENDING:
                return json_answer(card_from_row(card), 200, headers)
            answer = NewCard(**card_from_row(card).model_dump(),
                             upload=_upload(presigned, card, settings),
                             uploaded_version=uploaded)
            return json_answer(answer, 201, headers)
        case files.Duplicate(card):
            known = KnownCard(**card_from_row(card).model_dump(), duplicate_of=card.id)
            return json_answer(known, 200, {"Location": f"/v1/files/{card.id}"})
        case files.TooLarge(limit):
            raise _too_large(limit)
        case files.Throttled(wait):
            raise Problem(429, "too_many_requests", "Too many files created with this key; "
                          "try again later.", headers={"Retry-After": str(wait)})
        case files.OverQuota(quota_files, quota_bytes):
            raise Problem(403, "quota_exceeded",
                          "This file would take the owner past its storage quota.",
                          quota_files=quota_files or None, quota_bytes=quota_bytes or None)
        case files.InvalidKey():
            raise invalid_field("Idempotency-Key", "1 to 255 printable ASCII characters")
        case files.ReusedKey():
            raise Problem(422, "idempotency_key_reused",
                          "This Idempotency-Key was already used with a different request.")
        case files.BusyKey():
            raise Problem(409, "conflict", "The request is in progress; try again.")
        case _:
            assert_never(made)


@router.put(
    "/v1/files/{file_id}/content",
    response_model=Stored,
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
async def put_content(file_id: FileId, who: Caller, flow: FilesDep, request: Request) -> Stored:
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    done = await flow.store_content(file_uuid(file_id), who.owner, request.stream(),
                                    declared)
    match done:
        case files.Stored(version):
            return Stored(version=version)
        case files.NotFound():
            raise not_found()
        case files.AlreadyConfirmed():
            raise Problem(409, "conflict", "The file was already confirmed.")
        case files.TooLarge(limit):
            raise _too_large(limit)
        case files.Empty():
            raise invalid_field("body", "the upload is empty")
        case files.SizeMismatch():
            raise _size_mismatch()
        case _:
            assert_never(done)


@router.post(
    "/v1/files/{file_id}/confirm",
    status_code=202,
    response_model=Card,
    responses=problems(401, 404, 409, 413, 422),
    summary="Queue the card for exactly this version of the original",
)
async def confirm(file_id: FileId, body: Confirm, who: Caller, flow: FilesDep) -> Response:
    fid = file_uuid(file_id)
    done = await flow.confirm(fid, who.owner, body.version)
    match done:
        case files.Confirmed(card, tidy):
            if tidy is not None:
                _after_answer(tidy)  # off the answer's path: the card is already queued
            return json_answer(card_from_row(card), 202, {"Location": f"/v1/files/{fid}"})
        case files.NotFound():
            raise not_found()
        case files.Conflict():
            raise Problem(409, "conflict",
                          "The file was already confirmed with another version.")
        case files.TooLarge(limit):
            raise _too_large(limit)
        case files.VersionNotFound():
            raise _version_not_found()
        case files.SizeMismatch():
            raise _size_mismatch()
        case files.DigestMismatch():
            raise Problem(422, "digest_mismatch", "The uploaded bytes do not have the sha256 "
                          "given when the file was created.")
        case _:
            assert_never(done)
