"""The admin's queue (DESIGN §4, admin key): its health, and the incident tools of the
console (pause and resume claiming, retry picked rejected cards)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from darkroom import stats
from darkroom.api.auth import Admin
from darkroom.api.deps import Actor, DbDep, QueueDep
from darkroom.api.problems import invalid_field, problems
from darkroom.api.schemas import (
    ClaimPause,
    Paused,
    PauseScope,
    QueueStats,
    Resumed,
    ResumeScope,
    RetriedPicked,
    RetryPicked,
)
from darkroom.card import Priority
from darkroom.pauses import ClaimPause as PauseRow
from darkroom.pauses import pause_claims as make_pause
from darkroom.pauses import resume_claims as lift_pauses
from darkroom.retry import RetryOutcome, retry_picked

log = logging.getLogger(__name__)

router = APIRouter(tags=["operations"])


@router.get(
    "/v1/queue",
    response_model=QueueStats,
    responses=problems(401, 403),
    summary="Queue health (admin key)",
)
async def queue_stats(who: Admin, db: DbDep) -> dict[str, Any]:
    return (await stats.read(db)).to_json()


def _pause_json(p: PauseRow) -> ClaimPause:
    return ClaimPause(owner=p.owner, priority=p.priority, paused_by=p.paused_by,
                      since=p.since)


@router.post(
    "/v1/queue/pause",
    response_model=Paused,
    responses=problems(401, 403, 413, 422),
    summary="Stop every worker starting attempts on these cards (admin key)",
)
async def pause_claims(body: PauseScope, who: Admin, db: DbDep) -> Paused:
    pause, changed = await make_pause(
        db, actor=f"api:{who.owner}", owner=body.owner,
        priority=None if body.priority is None else Priority(body.priority))
    if changed:
        log.info("claiming paused", extra={"scope": pause.scope(), "by": pause.paused_by})
    return Paused(pause=_pause_json(pause), changed=changed)


@router.post(
    "/v1/queue/resume",
    response_model=Resumed,
    responses=problems(401, 403, 413, 422),
    summary="Lift the pause of exactly these cards, or every pause (admin key)",
)
async def resume_claims(body: ResumeScope, who: Admin, db: DbDep) -> Resumed:
    if body.all and (body.owner is not None or body.priority is not None):
        raise invalid_field("all", "all takes no owner or priority")
    lifted = await lift_pauses(
        db, actor=f"api:{who.owner}", owner=body.owner,
        priority=None if body.priority is None else Priority(body.priority), every=body.all)
    for p in lifted:
        log.info("claiming resumed", extra={"scope": p.scope(), "by": f"api:{who.owner}"})
    return Resumed(resumed=[_pause_json(p) for p in lifted])


@router.post(
    "/v1/queue/retry",
    response_model=RetriedPicked,
    responses=problems(401, 403, 413, 422),
    summary="Queue again the rejected cards picked in the console, any owner's (admin key)",
    description="At most 500 ids. Each card rejected for a fault that was not the file's "
    "own is queued again as bulk work; the answer says per id what became of it. Safe to "
    "repeat: a card already queued again answers `not_rejected` with its status.",
)
async def retry_picked_cards(
    body: RetryPicked, who: Admin, queue: QueueDep, actor: Actor
) -> RetriedPicked:
    done = await retry_picked(queue, body.ids, actor)
    queued = sum(1 for d in done if d.outcome is RetryOutcome.QUEUED)
    if queued:
        log.info("rejected cards queued again", extra={"cards": queued, "by": who.owner})
    return RetriedPicked.model_validate({
        "results": [{"id": d.id, "outcome": str(d.outcome), "status": d.status}
                    for d in done],
        "queued": queued})
