"""Owners' weights (`darkroom owners weight`): an owner's share of the workers against the
other owners with work waiting (DESIGN §3.13). A weight changes no card's status: the
claim reads it when it stamps a card's place in the fair order."""

from __future__ import annotations

from darkroom.config import Settings
from darkroom.db.connection import database_url
from darkroom.db.database import Database, opened

__all__ = ["set_owner_weight", "set_weight"]


async def set_owner_weight(db: Database, owner: str, weight: float) -> None:
    """An owner's share of the workers (default 1). It applies to cards stamped from now
    on; safe to repeat."""
    await db.rows("set_owner_weight", {"owner": owner, "weight": weight})


async def set_weight(settings: Settings, owner: str, weight: float) -> None:
    """`darkroom owners weight`, on the database directly."""
    async with opened(database_url(settings), name="owners") as db:
        await set_owner_weight(db, owner, weight)
