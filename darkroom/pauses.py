"""An operator's pauses of claiming (`darkroom pause`, `POST /v1/queue/pause`): while one
is in force, no worker starts an attempt on a card it covers; running attempts go on.

The claim (`db/queries.sql`) passes over the cards a pause covers; this module makes,
lifts and lists the pauses (`db/pauses.sql`). A pause changes no card's status. Each
change writes its event naming who asked, in the same statement, and a repeat changes
nothing: a pause or resume whose answer was lost is simply sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from darkroom.card import Priority
from darkroom.db.database import Database

__all__ = ["PAUSE_LOG", "ClaimPause", "PauseEvent", "claim_pauses", "pause_claims",
           "pause_log", "resume_claims"]

# The latest pauses and resumes in the queue's health, newest first.
PAUSE_LOG = 10


@dataclass(frozen=True, slots=True)
class ClaimPause:
    """An operator's pause of claiming: no attempt starts on a card it covers. None in
    `owner` or `priority` means every one."""

    owner: str | None
    priority: str | None
    paused_by: str
    since: datetime

    def scope(self) -> str:
        parts = [f"owner {self.owner}" if self.owner else "",
                 f"{self.priority} cards" if self.priority else ""]
        return ", ".join(p for p in parts if p) or "every card"


@dataclass(frozen=True, slots=True)
class PauseEvent:
    """One pause or resume, as `claim_pause_events` keeps it."""

    id: int
    kind: str  # paused, resumed
    owner: str | None
    priority: str | None
    actor: str
    created_at: datetime


async def pause_claims(db: Database, *, actor: str, owner: str | None = None,
                       priority: Priority | None = None) -> tuple[ClaimPause, bool]:
    """Stop every worker starting attempts on the cards of this scope (running ones go
    on). Answers the pause in force and whether this call made it; safe to repeat."""
    params = {"owner": owner, "priority": None if priority is None else str(priority),
              "actor": actor}
    while True:
        rows = await db.rows("pause_claims", params)
        if rows:
            row = rows[0]
            return (ClaimPause(owner=row["owner"], priority=row["priority"],
                               paused_by=row["paused_by"], since=row["since"]),
                    bool(row["changed"]))
        # No row: the same pause was made (or lifted) by a statement that committed
        # while this one ran, after its snapshot was taken. Asking again sees it.


async def resume_claims(db: Database, *, actor: str, owner: str | None = None,
                        priority: Priority | None = None,
                        every: bool = False) -> list[ClaimPause]:
    """Lift the pause of exactly this scope (or, `every`, all of them) and wake the
    workers; answers the pauses lifted (none on a repeat)."""
    rows = await db.rows("resume_claims", {
        "owner": owner, "priority": None if priority is None else str(priority),
        "every": every, "actor": actor})
    return [ClaimPause(owner=r["owner"], priority=r["priority"],
                       paused_by=r["paused_by"], since=r["since"]) for r in rows]


async def claim_pauses(db: Database) -> list[ClaimPause]:
    """The pauses in force, oldest first."""
    return await db.typed("claim_pauses", {}, ClaimPause)


async def pause_log(db: Database, limit: int = PAUSE_LOG) -> list[PauseEvent]:
    """The latest pauses and resumes, newest first."""
    return await db.typed("claim_pause_events", {"limit": limit}, PauseEvent)
