"""The queue's health has one typed form (`stats.QueueStats`) and one JSON form, which the
API's schema, the page and `darkroom stats --json` read: their names must stay the same."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from darkroom.api import schemas
from darkroom.pauses import ClaimPause, PauseEvent
from darkroom.stats import Backlog, OwnerBacklog, PriorityBacklog, QueueStats, render

AT = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
STATS = QueueStats(
    counts={"pending": 0, "queued": 3, "processing": 1, "ready": 5, "rejected": 1,
            "deleting": 0},
    oldest_claimable_age_seconds=1.5, expired_leases=0, rejected_share_1h=0.1,
    rejected_share_24h=None, completed_last_minute=2, lease_lost_total=1,
    paused_workers=("w1",),
    backlog=Backlog(
        by_priority={"interactive": PriorityBacklog(2, 1.5), "bulk": PriorityBacklog(1, None)},
        owners_waiting=1,
        top_owners=(OwnerBacklog("alice", 3, 2, 1, 1.5),)),
    rederive_pending=1,
    claim_pauses=(ClaimPause(owner=None, priority="bulk", paused_by="cli:ops", since=AT),),
    claim_pause_log=(PauseEvent(id=7, kind="paused", owner=None, priority="bulk",
                                actor="cli:ops", created_at=AT),),
    rejected_by_code={"unsupported_format": 1},
)


def _same_names(model: type[BaseModel], value: dict[str, Any]) -> None:
    assert set(value) == set(model.model_fields), model.__name__


def test_the_json_form_names_exactly_the_fields_of_the_api_schema() -> None:
    value = STATS.to_json()
    _same_names(schemas.QueueStats, value)
    _same_names(schemas.Backlog, value["backlog"])
    for b in value["backlog"]["by_priority"].values():
        _same_names(schemas.PriorityBacklog, b)
    _same_names(schemas.OwnerBacklog, value["backlog"]["top_owners"][0])
    _same_names(schemas.ClaimPause, value["claim_pauses"][0])
    _same_names(schemas.PauseEvent, value["claim_pause_log"][0])
    # And the schema takes it as it is (what GET /v1/queue answers).
    assert schemas.QueueStats.model_validate(value).backlog.top_owners[0].owner == "alice"


def test_the_text_form_shows_the_figures() -> None:
    text = render(STATS, demand=4)
    assert "worker demand (slots)  4" in text
    assert "paused workers         w1  (object store failing)" in text
    assert f"claiming paused        bulk cards (by cli:ops since {AT.isoformat()})" in text
    assert "rejected by code       unsupported_format 1" in text
    assert "alice" in text
