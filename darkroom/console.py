"""An operator's commands for an incident: `darkroom show`, `darkroom pause`, `darkroom
resume`. They act on the database directly, as `darkroom stats` does."""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from typing import Any

from darkroom.card import Card, HistoryEntry, Priority
from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.database import opened
from darkroom.pauses import ClaimPause, pause_claims, resume_claims
from darkroom.reads import Reads

# Events read per statement by `darkroom show`.
_PAGE = 500


def cli_actor() -> str:
    """Who asked, as a pause's event names a command-line operator."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        import os
        user = f"uid {os.getuid()}"
    return f"cli:{user}@{socket.gethostname()}"[:200]


def _priority(value: str | None) -> Priority | None:
    return None if value is None else Priority(value)


def _owner(value: str | None) -> str | None:
    if value is not None and not 1 <= len(value.strip()) <= 200:
        raise ConfigError("--owner must be 1 to 200 characters")
    return None if value is None else value.strip()


async def pause(settings: Settings, *, owner: str | None, priority: str | None
                ) -> tuple[ClaimPause, bool]:
    async with opened(database_url(settings), name="console") as db:
        return await pause_claims(
            db, actor=cli_actor(), owner=_owner(owner), priority=_priority(priority))


async def resume(settings: Settings, *, owner: str | None, priority: str | None,
                 every: bool) -> list[ClaimPause]:
    async with opened(database_url(settings), name="console") as db:
        return await resume_claims(
            db, actor=cli_actor(), owner=_owner(owner), priority=_priority(priority),
            every=every)


async def show(settings: Settings, file_id: str) -> tuple[Card, list[HistoryEntry]] | None:
    try:
        fid = uuid.UUID(file_id)
    except ValueError:
        raise ConfigError(f"not a card id: {file_id[:60]!r}") from None
    async with opened(database_url(settings), name="console") as db:
        reads = Reads(db)
        card = await reads.get_any_file(fid)
        if card is None:
            return None
        history: list[HistoryEntry] = []
        while True:
            page = await reads.history(fid, None, limit=_PAGE,
                                       after=history[-1].id if history else None)
            if not page:
                return card, history
            history.extend(page)


def render_pause(pause: ClaimPause, made: bool) -> str:
    if made:
        return f"paused: {pause.scope()} (no new attempts start; running ones go on)"
    return (f"already paused: {pause.scope()}, by {pause.paused_by} since "
            f"{pause.since:%Y-%m-%d %H:%M:%S %Z}")


def render_resume(lifted: list[ClaimPause]) -> str:
    if not lifted:
        return "nothing to resume: no pause of that scope"
    return "\n".join(f"resumed: {p.scope()} (paused by {p.paused_by})" for p in lifted)


def _duration(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


def render_show(card: Card, history: list[HistoryEntry]) -> str:
    lines = [
        f"card      {card.id}",
        f"owner     {card.owner}",
        f"file      {card.filename} ({card.content_type}, {card.size_bytes} bytes)",
        f"status    {card.status}" + (f" ({card.error_code})" if card.error_code else ""),
        f"priority  {card.priority}",
        f"attempts  {card.attempts}",
        f"created   {card.created_at:%Y-%m-%d %H:%M:%S %Z}",
        f"updated   {card.updated_at:%Y-%m-%d %H:%M:%S %Z}",
        "",
        f"{'time':<26} {'event':<16} {'attempt':>7}  {'took':>8}  {'code':<20} worker",
    ]
    lines += [
        f"{e.created_at:%Y-%m-%d %H:%M:%S.%f}"[:23].ljust(26)
        + f" {e.kind:<16} {'' if e.attempt is None else e.attempt:>7}"
        f"  {_duration(e.duration_seconds):>8}  {e.error_code or '':<20} {e.worker or ''}"
        for e in history
    ]
    if not history:
        lines.append("(no events)")
    return "\n".join(lines)


def show_json(card: Card, history: list[HistoryEntry]) -> str:
    def event(e: HistoryEntry) -> dict[str, Any]:
        return {"kind": e.kind, "at": e.created_at.isoformat(), "attempt": e.attempt,
                "worker": e.worker, "error_code": e.error_code,
                "duration_seconds": e.duration_seconds}

    return json.dumps({
        "id": str(card.id), "owner": card.owner, "filename": card.filename,
        "status": str(card.status), "error_code": card.error_code,
        "priority": str(card.priority), "attempts": card.attempts,
        "created_at": card.created_at.isoformat(), "updated_at": card.updated_at.isoformat(),
        "events": [event(e) for e in history]}, indent=2)
