"""A caller's cards (DESIGN §4): one, the list, a card's history, its derivative, a retry
of a rejected card, a delete. (Uploading is `uploads.py`'s.)

Every card lookup is by (id, owner): another owner's file and a missing one take the same
path through the code and answer the same 404, so nothing tells them apart.
"""

from __future__ import annotations

import logging
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from darkroom.api.auth import Caller
from darkroom.api.deps import Actor, FileId, QueueDep, ReadsDep, StoreDep, file_uuid
from darkroom.api.problems import Problem, invalid_field, not_found, problems
from darkroom.api.schemas import (
    Card,
    CardList,
    DerivativeSize,
    ErrorCodeName,
    History,
    HistoryEvent,
    Status,
    card_from_row,
    decode_cursor,
    decode_event_cursor,
    encode_cursor,
    encode_event_cursor,
    json_answer,
)
from darkroom.card import Card as CardRow
from darkroom.card import Status as CardStatus
from darkroom.errors import ObjectMissing
from darkroom.reads import Reads
from darkroom.retry import RetryOutcome, retry_card

log = logging.getLogger(__name__)

router = APIRouter(tags=["files"])

_PRESIGN_GET_SECONDS = 300


async def _card(reads: Reads, raw_id: str, owner: str) -> CardRow:
    card = await reads.get_file(file_uuid(raw_id), owner)
    if card is None:
        raise not_found()
    return card


@router.get(
    "/v1/files/{file_id}",
    response_model=Card,
    responses=problems(401, 404),
    summary="One card",
)
async def get_file(file_id: FileId, who: Caller, reads: ReadsDep) -> Response:
    return json_answer(card_from_row(await _card(reads, file_id, who.owner)), 200)


@router.get(
    "/v1/files",
    response_model=CardList,
    responses=problems(401, 422),
    summary="The caller's cards, newest first",
)
async def list_files(
    who: Caller,
    reads: ReadsDep,
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
        rows = await reads.list_rejected(code=code, limit=limit + 1, after=after)
    else:
        rows = await reads.list_files(
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
    responses=problems(401, 404, 422),
    summary="A card's history, oldest first (an admin key: any owner's card)",
)
async def file_events(
    file_id: FileId,
    who: Caller,
    reads: ReadsDep,
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
    rows = await reads.history(
        file_uuid(file_id), None if who.admin else who.owner, limit=limit + 1, after=after)
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
    reads: ReadsDep,
    store: StoreDep,
    request: Request,
    size: Annotated[
        DerivativeSize,
        Query(description="`preview` (≤ 2048 px) or `thumb` (≤ 400 px)."),
    ] = "preview",
) -> Response:
    row = await _card(reads, file_id, who.owner)
    # A card being re-derived keeps serving its previous derivative until the new one is
    # published.
    # (The fenced commit writes an object's key and version together.)
    if row.derived_key is None or row.derived_version is None:
        raise Problem(409, "not_ready", f"The file is {row.status}, not ready.")
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


@router.post(
    "/v1/files/{file_id}/retry",
    status_code=202,
    response_model=Card,
    responses=problems(401, 404, 409),
    summary="Queue a rejected card again, with a fresh attempt budget",
    description="Only a card rejected for a fault that was not the file's own "
    "(`storage_unavailable`, `processing_timeout`, `attempts_exhausted`); any other card "
    "answers `409 not_retryable`.",
)
async def retry_file(file_id: FileId, who: Caller, queue: QueueDep, actor: Actor) -> Response:
    done = await retry_card(queue, file_uuid(file_id), who.owner, actor)
    if done.outcome is RetryOutcome.NOT_FOUND:
        raise not_found()
    if done.outcome is RetryOutcome.NOT_RETRYABLE or done.card is None:
        raise Problem(409, "not_retryable",
                      "Only a file rejected for storage_unavailable, processing_timeout or "
                      "attempts_exhausted can be retried.")
    return json_answer(card_from_row(done.card), 202,
                       {"Location": f"/v1/files/{done.card.id}"})


@router.delete(
    "/v1/files/{file_id}",
    status_code=202,
    responses={202: {"description": "The card is being deleted."}, **problems(401, 404)},
    response_class=Response,
    summary="Delete a file",
)
async def delete_file(file_id: FileId, who: Caller, queue: QueueDep) -> Response:
    if not await queue.revoke(file_uuid(file_id), who.owner):
        raise not_found()
    return Response(status_code=202)
