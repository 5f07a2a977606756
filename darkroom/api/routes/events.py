"""The caller's live feed (DESIGN §4): status changes of their cards, pushed as
server-sent events. The streams themselves are `api/events.py`'s `Hub`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from darkroom.api.auth import Caller
from darkroom.api.events import Hub
from darkroom.api.problems import problems
from darkroom.keys import find_key_hash

router = APIRouter(tags=["files"])


@router.get(
    "/v1/events",
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
