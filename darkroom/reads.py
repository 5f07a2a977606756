"""What the queue holds, read: a card, a listing, a card's history, and the figures the
commands that change many cards (retry, rederive, the sweeper's pending check) decide
from.

Reads only: every status change is `queue.py`'s. Rows are built by column name
(`card.Card`, `card.Event`, ...). Anything that holds a `Database` can read: the API, the
sweeper and the commands make a `Reads` beside their `Queue`, on the same pool.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from darkroom.card import Card, Event, HistoryEntry, PendingCard, Status
from darkroom.db.database import Database

__all__ = ["Reads", "RetryTarget"]


@dataclass(frozen=True, slots=True)
class RetryTarget:
    """A card a console retry names: whose it is and where it stands."""

    id: uuid.UUID
    owner: str
    status: str
    error_code: str | None


class Reads:
    """Cards and their histories as the API, the console and the commands read them."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return await self.db.rows(name, params)

    async def _cards(self, name: str, params: dict[str, Any]) -> list[Card]:
        return await self.db.typed(name, params, Card)

    # --- cards -----------------------------------------------------------------------

    async def get_file(self, file_id: uuid.UUID, owner: str) -> Card | None:
        rows = await self._cards("get_file", {"id": file_id, "owner": owner})
        return rows[0] if rows else None

    async def list_files(
        self, owner: str, *, status: Status | None = None, limit: int = 50,
        after: tuple[datetime, uuid.UUID] | None = None, code: str | None = None,
    ) -> list[Card]:
        return await self._cards("list_files", {
            "owner": owner, "status": None if status is None else str(status),
            "code": code, "limit": limit,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        })

    async def get_any_file(self, file_id: uuid.UUID) -> Card | None:
        """A card whoever owns it (an operator's view)."""
        rows = await self._cards("get_any_file", {"id": file_id})
        return rows[0] if rows else None

    async def list_rejected(
        self, *, code: str | None = None, limit: int = 50,
        after: tuple[datetime, uuid.UUID] | None = None,
    ) -> list[Card]:
        """Every owner's rejected cards (with `code`, or any), newest first: an admin's."""
        return await self._cards("list_rejected_any_owner", {
            "code": code, "limit": limit,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        })

    async def pending_due(self, *, ttl_seconds: float, limit: int) -> list[PendingCard]:
        """A batch of cards left pending past `ttl_seconds`, oldest first."""
        return await self.db.typed("pending_due", {"ttl_seconds": ttl_seconds, "limit": limit},
                                   PendingCard)

    # --- history ---------------------------------------------------------------------

    async def history(
        self, file_id: uuid.UUID, owner: str | None, *, limit: int = 100,
        after: int | None = None,
    ) -> list[HistoryEntry] | None:
        """A page of the card's history, oldest first, after event id `after`; None when
        there is no such card (of `owner`'s; `owner` None: of anyone's)."""
        rows = await self._rows("file_history", {"id": file_id, "owner": owner,
                                                 "limit": limit, "after": after})
        if not rows:
            return None
        return [HistoryEntry(**r) for r in rows if r["id"] is not None]

    async def events(self, file_id: uuid.UUID) -> list[Event]:
        """The file's history, oldest first (while its card exists; see file_events)."""
        return await self.db.typed("file_events", {"id": file_id}, Event)

    # --- re-derive -------------------------------------------------------------------

    async def rederive_owners(self, fingerprint: str, owner: str | None = None
                              ) -> dict[str, int]:
        """Ready cards whose derivative was made with other settings, per owner."""
        rows = await self._rows("rederive_owners",
                                {"fingerprint": fingerprint, "owner": owner})
        return {r["owner"]: int(r["n"]) for r in rows}

    async def rederive_pending(self, owner: str | None = None) -> int:
        rows = await self._rows("rederive_pending", {"owner": owner})
        return int(rows[0]["n"])

    # --- retry ------------------------------------------------------------------------

    async def retry_candidates(
        self, *, owner: str | None, codes: Sequence[str] | None, since: datetime | None,
    ) -> dict[tuple[str, str], int]:
        """Rejected cards a retry would take, by (owner, code). `codes` None: any code."""
        rows = await self._rows("retry_candidates", {
            "owner": owner, "codes": None if codes is None else list(codes), "since": since})
        return {(r["owner"], r["error_code"]): int(r["n"]) for r in rows}

    async def retry_targets(self, ids: Sequence[uuid.UUID]) -> list[RetryTarget]:
        """Where each of `ids` stands, and whose it is (a missing or deleted card: absent)."""
        if not ids:
            return []
        return await self.db.typed("retry_targets", {"ids": list(ids)}, RetryTarget)

    async def retried_by_run(self, owner: str, run: uuid.UUID) -> list[uuid.UUID]:
        """The cards of `owner` that the retry run `run` re-queued."""
        return [r["id"] for r in await self._rows("retried_by_run",
                                                    {"owner": owner, "run": run})]

    async def retry_waiting(self, ids: Sequence[uuid.UUID]) -> int:
        """How many of `ids` are queued or processing."""
        if not ids:
            return 0
        rows = await self._rows("retry_waiting", {"ids": list(ids)})
        return int(rows[0]["n"])
