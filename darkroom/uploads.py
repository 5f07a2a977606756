"""Uploads that are safe to retry: idempotency keys and known content.

A client that lost the answer to `POST /v1/files` sends the same request again with the
same `Idempotency-Key` and gets the card the first one made, never a second card. A
client that names the content's sha256 learns when the archive already holds those
bytes. The digest is a claim: it is trusted for nothing until confirm has hashed the
stored bytes (see `Queue.confirm_card`), and only verified digests are looked up here.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from darkroom.db.database import Database
from darkroom.queue import Priority, Queue

# A key is honoured at least this long; the sweeper removes older ones.
KEY_RETENTION_SECONDS = 86_400
MAX_KEY_LENGTH = 255
# A create retried against a key whose card is being deleted, or raced by a concurrent
# create with the same key, settles within a couple of rounds.
_ROUNDS = 3


class KeyReused(Exception):
    """The owner used this key before for a different request."""


class KeyBusy(Exception):
    """The key changed hands on every round (a create racing deletes): try again."""


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def request_hash(fields: dict[str, Any]) -> bytes:
    """The request's fingerprint: its validated fields, canonically encoded."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).digest()


def valid_key(key: str) -> bool:
    """1 to 255 printable ASCII characters, as Stripe and the IETF draft use them."""
    return 0 < len(key) <= MAX_KEY_LENGTH and all(32 <= ord(ch) < 127 for ch in key)


@dataclass(frozen=True, slots=True)
class Created:
    row: dict[str, Any]
    replayed: bool = False  # the key's earlier card, not a new one
    duplicate: bool = False  # the owner's live card with these bytes, not a new one


class Uploads:
    """The statements of `db/uploads.sql`. None of them changes a card's status."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return await self.db.rows(name, params)

    async def lookup(self, owner: str, key: bytes) -> dict[str, Any] | None:
        rows = await self._rows("idempotency_lookup", {"owner": owner, "key_hash": key})
        return rows[0] if rows else None

    async def release(self, owner: str, key: bytes, file_id: uuid.UUID) -> None:
        await self._rows("idempotency_release",
                         {"owner": owner, "key_hash": key, "file_id": file_id})

    async def known_original(self, owner: str, sha256: str) -> dict[str, Any] | None:
        rows = await self._rows("find_known_original", {"owner": owner, "sha256": sha256})
        return rows[0] if rows else None

    async def _replay(self, owner: str, key: bytes, fingerprint: bytes
                      ) -> dict[str, Any] | None:
        """The key's live card; None when the key is free (never used, or its card is gone)."""
        found = await self.lookup(owner, key)
        if found is None:
            return None
        if bytes(found["key_request_hash"]) != fingerprint:
            raise KeyReused()
        if found["id"] is None or found["status"] == "deleting":
            await self.release(owner, key, found["key_file_id"])
            return None
        return found

    async def create(
        self, queue: Queue, *, owner: str, filename: str, content_type: str, size: int,
        sha256: str | None, allow_duplicate: bool, key: str | None, fields: dict[str, Any],
        priority: Priority = Priority.INTERACTIVE,
        quota_files: int = 0, quota_bytes: int = 0,
    ) -> Created:
        """The create of `POST /v1/files` with its key and digest.

        In order: the key's card if the owner used the key before (same request) ;
        else the owner's live card with this verified digest, unless the client allows a
        duplicate; else a new card, the key recorded with it in the same statement.
        """
        hashed = key_hash(key) if key is not None else None
        fingerprint = request_hash(fields) if key is not None else None
        for _ in range(_ROUNDS):
            if hashed is not None and fingerprint is not None:
                earlier = await self._replay(owner, hashed, fingerprint)
                if earlier is not None:
                    return Created(earlier, replayed=True)
            if sha256 is not None and not allow_duplicate:
                known = await self.known_original(owner, sha256)
                if known is not None:
                    return Created(known, duplicate=True)
            row = await queue.create_file_keyed(
                owner=owner, filename=filename, content_type=content_type, size=size,
                sha256=sha256, key_hash=hashed, request_hash=fingerprint,
                quota_files=quota_files, quota_bytes=quota_bytes, priority=priority)
            if row is not None:
                return Created(row)
            # A concurrent create with the same key committed first: answer its card.
        raise KeyBusy()
