"""The lease protocol (DESIGN §3): every change of a card's status happens here.

The worker, the API and the sweeper call these methods and never write `status`
themselves. Each method is one statement (see `db/queries.sql`), so each transition is
atomic and its event is written in the same transaction as the change it records. Reading
cards is `reads.py`'s, the queue's health `stats.py`'s, an operator's pauses of claiming
`pauses.py`'s and owners' weights `owners.py`'s: none of them changes a status.

The invariants this module keeps:
- a card is `processing` exactly while some attempt holds a lease (`lease_token`,
  `lease_until`), and the lease is time-limited by the database's clock;
- a result is published only by the attempt whose token still holds the lease; a stale
  attempt's commit changes nothing, is recorded as `lease_lost`, and its object is left
  to the sweeper;
- a file is started at most `max_attempts` times, however its attempts ended; an attempt
  the object store failed is given back (`defer`), and at most `max_deferrals` of those
  are counted against the file (`defer_counted`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import psycopg

from darkroom import layout
from darkroom.card import STATUSES, Card, Event, HistoryEntry, PendingCard, Priority, Status
from darkroom.db.database import CONNECTION_ERRORS, Database, Statements
from darkroom.errors import TRANSIENT_CODES, DarkroomError, ErrorCode
from darkroom.layout import derived_key, original_key, thumb_key
from darkroom.recipe import settings_fingerprint

if TYPE_CHECKING:
    from darkroom.config import Settings

__all__ = ["PAUSED_NOTICE", "STATUSES", "Card", "ClaimUnknown", "ConfirmOutcome",
           "Confirmation", "Derived", "Event", "HistoryEntry", "Lease", "LeaseLost",
           "PendingCard", "Priority", "Queue", "Status", "backoff_delay", "derived_key",
           "original_key", "thumb_key"]

NOTIFY_CHANNEL = "darkroom_jobs"
# The payload of a pause's notification on NOTIFY_CHANNEL (pauses.sql `pause_claims`):
# workers hand back the leases they keep ahead, so that no paused card starts from them.
PAUSED_NOTICE = "paused"


class ClaimUnknown(DarkroomError):
    """A claim's answer was lost: it may have leased rows. `Queue.adopt_claim` finds them."""

    def __init__(self, claim_id: uuid.UUID) -> None:
        super().__init__(f"the outcome of claim {str(claim_id)[:8]} is unknown")
        self.claim_id = claim_id


class QuotaExceeded(DarkroomError):
    """A new card would take its owner past `DARKROOM_OWNER_QUOTA_BYTES` or `_FILES`."""


class LeaseLost(DarkroomError):
    """The attempt no longer holds its lease: it must not publish, and it has not."""

    def __init__(self, file_id: uuid.UUID, token: uuid.UUID) -> None:
        super().__init__(f"lease lost for {file_id} (token {str(token)[:8]})")
        self.file_id = file_id
        self.token = token


@dataclass(frozen=True, slots=True)
class Lease:
    """One attempt's right to publish a result for one card, until `lease_until`."""

    file_id: uuid.UUID
    token: uuid.UUID
    attempt: int
    lease_until: datetime
    owner: str
    original_key: str
    original_version: str | None

    @property
    def token_prefix(self) -> str:
        return str(self.token)[:8]


@dataclass(frozen=True, slots=True)
class Derived:
    """What a successful attempt publishes."""

    key: str
    version: str
    sha256: str
    width: int
    height: int
    size: int
    # The thumb (≤ 400 px) and the placeholder, published by the same commit.
    thumb: DerivedObject | None = None
    thumbhash: str | None = None


@dataclass(frozen=True, slots=True)
class DerivedObject:
    """One more stored object of a result (the thumb)."""

    key: str
    version: str
    sha256: str
    width: int
    height: int
    size: int



class ConfirmOutcome(StrEnum):
    QUEUED = "queued"  # pending -> queued now
    ALREADY = "already"  # the same version was confirmed before: nothing changed
    CONFLICT = "conflict"  # confirmed before with another version
    SIZE_MISMATCH = "size_mismatch"  # still pending: the stored size is not the declared one
    NOT_FOUND = "not_found"
    DIGEST_REQUIRED = "digest_required"  # pending, with a claimed digest not (yet) matched


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What `Queue.confirm_card` did."""

    outcome: ConfirmOutcome
    card: Card | None = None  # QUEUED (by this call): the card as it is now
    claimed_sha256: str | None = None  # DIGEST_REQUIRED: the digest claimed at create


def claim_params(*, n: int, claim: uuid.UUID, max_attempts: int, lease_seconds: float,
                 worker: str, bulk_share: float,
                 committing: Sequence[uuid.UUID] = ()) -> dict[str, Any]:
    """The `claim` statement's parameters: what `Queue.claim` sends, for a caller that sends
    the statement itself (a benchmark timing it, a test whose claim's answer is lost).
    `committing`: the cards whose results are committed with the claim, never rescued by it."""
    return {"n": n, "max_attempts": max_attempts, "claim": claim,
            "lease_seconds": lease_seconds, "worker": worker, "bulk_share": bulk_share,
            "committing": list(committing)}


def backoff_delay(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(attempt-1))].

    Full jitter spreads retries of a fault that hit many files at once, so the recovering
    dependency is not met by a synchronized wave.
    """
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(0.0, ceiling)


class Queue:
    """The one owner of status changes. Safe to share among tasks of one event loop."""

    def __init__(
        self,
        db: Database,
        *,
        lease_seconds: float,
        max_attempts: int,
        retry_base_seconds: float,
        retry_cap_seconds: float,
        worker: str = "",
        rng: random.Random | None = None,
        fingerprint: str | None = None,
        max_deferrals: int = 10,
        bulk_share: float = 0.1,
    ) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.max_deferrals = max_deferrals
        self.retry_base_seconds = retry_base_seconds
        self.retry_cap_seconds = retry_cap_seconds
        self.worker = worker
        self._rng = rng or random.Random()
        # The derivative settings this process derives with (recipe.settings_fingerprint),
        # stored with every derivative it publishes.
        self.fingerprint = fingerprint
        # The least share of claims bulk work gets while interactive work is also due.
        self.bulk_share = bulk_share

    @classmethod
    def from_settings(cls, db: Database, settings: Settings, worker: str = "") -> Queue:
        return cls(
            db,
            lease_seconds=settings.lease_seconds,
            max_attempts=settings.max_attempts,
            retry_base_seconds=settings.retry_base_seconds,
            retry_cap_seconds=settings.retry_cap_seconds,
            worker=worker,
            fingerprint=settings_fingerprint(settings),
            max_deferrals=settings.max_deferrals,
            bulk_share=settings.bulk_share,
        )

    def listen(self) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Wake-ups (a NOTIFY whenever a card may have become claimable), on a connection
        of their own for as long as the block lasts."""
        return self.db.listen(NOTIFY_CHANNEL)

    async def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return await self.db.rows(name, params)

    async def _leases(self, name: str, params: dict[str, Any]) -> list[Lease]:
        """Rows of a statement that answers leases, built by column name."""
        return await self.db.typed(name, params, Lease)

    async def _cards(self, name: str, params: dict[str, Any]) -> list[Card]:
        """Rows of a statement that answers cards, built by column name."""
        return await self.db.typed(name, params, Card)

    # --- cards -----------------------------------------------------------------------

    async def create_file(
        self, *, owner: str, filename: str, content_type: str, size: int,
        file_id: uuid.UUID | None = None, priority: Priority = Priority.INTERACTIVE,
        quota_files: int = 0, quota_bytes: int = 0, original_key: str | None = None,
    ) -> Card:
        """A new card in `pending`; its original goes under a key derived from its id and
        owner (layout.original_key), or `original_key` for bytes already stored (a
        restore of an original whose key is in the old form).

        Raises `QuotaExceeded` when it would take the owner past a quota (0: none). A
        retried creation is a second card; an unconfirmed one expires (`expire_pending`).
        """
        card = await self.create_file_keyed(
            owner=owner, filename=filename, content_type=content_type, size=size,
            file_id=file_id, priority=priority, quota_files=quota_files,
            quota_bytes=quota_bytes, original_key=original_key)
        assert card is not None  # only an idempotency key already held makes no card
        return card

    async def create_file_keyed(
        self, *, owner: str, filename: str, content_type: str, size: int,
        file_id: uuid.UUID | None = None, sha256: str | None = None,
        key_hash: bytes | None = None, request_hash: bytes | None = None,
        priority: Priority = Priority.INTERACTIVE,
        quota_files: int = 0, quota_bytes: int = 0, original_key: str | None = None,
    ) -> Card | None:
        """`create_file` with a claimed digest and an idempotency key (both optional).

        None when the owner already holds `key_hash` (made by an earlier or a concurrent
        create): no card is made, and the caller answers the key's card instead. Raises
        `QuotaExceeded` when a new card would take the owner past a quota (0: none); the
        owner's creations are serialized for the check, so concurrent ones cannot
        overshoot together.
        """
        file_id = file_id or uuid.uuid4()
        params = {
            "id": file_id, "owner": owner, "filename": filename,
            "content_type": content_type, "size": size,
            "original_key": original_key or layout.original_key(file_id, owner), "sha256": sha256,
            "key_hash": key_hash, "request_hash": request_hash,
            "priority": str(Priority(priority)),
        }
        if not quota_files and not quota_bytes:
            rows = await self._cards("create_file", params)
            return rows[0] if rows else None
        async with self.db.transaction() as tx:
            if not await _within_quota(tx, owner, size, quota_files, quota_bytes, key_hash):
                raise QuotaExceeded(owner)
            rows = await tx.typed("create_file", params, Card)
        return rows[0] if rows else None

    async def confirm_card(
        self, file_id: uuid.UUID, owner: str, version: str, sha256: str | None = None,
        size: int | None = None,
    ) -> Confirmation:
        """pending -> queued for exactly `version`, with NOTIFY; idempotent for the same
        version. Also the queued card when this call moved it.

        A card created with a claimed digest moves only with `sha256`, the digest of the
        stored bytes of `version`, equal to the claim: otherwise the answer is
        DIGEST_REQUIRED with the claim. With `size` (the version's stored size), a card
        declared with another size stays pending (SIZE_MISMATCH), whatever its digest.
        """
        rows = await self._rows("confirm", {"id": file_id, "owner": owner, "version": version,
                                            "sha256": sha256, "size": size})
        if not rows:
            return Confirmation(ConfirmOutcome.NOT_FOUND)
        row = rows[0]
        if row["moved"]:
            return Confirmation(ConfirmOutcome.QUEUED, card=Card.from_columns(row))
        if row["previous_status"] == Status.PENDING:
            if size is not None and row["declared_size"] != size:
                return Confirmation(ConfirmOutcome.SIZE_MISMATCH)
            return Confirmation(ConfirmOutcome.DIGEST_REQUIRED,
                                claimed_sha256=row["claimed_sha256"])
        if row["previous_version"] == version:
            return Confirmation(ConfirmOutcome.ALREADY)
        return Confirmation(ConfirmOutcome.CONFLICT)

    async def revoke(self, file_id: uuid.UUID, owner: str) -> bool:
        """Any state -> deleting; the lease (if any) is revoked so nothing can publish."""
        return bool(await self._rows("revoke", {"id": file_id, "owner": owner}))

    async def confirm_found_upload(self, card: PendingCard, *, ttl_seconds: float,
                                   version: str, sha256: str | None) -> bool:
        """pending -> queued for a card past the TTL whose upload `version` is in the store
        with the declared size (and `sha256`, its digest, when the card claimed one).
        Answers whether this call moved it; a repeat, or a confirm that won, moves nothing."""
        rows = await self._rows("pending_found_upload", {
            "id": card.id, "ttl_seconds": ttl_seconds, "size": card.size_bytes,
            "version": version, "sha256": sha256, "worker": self.worker})
        return bool(rows)

    async def expire_pending(self, ids: Sequence[uuid.UUID], *,
                             ttl_seconds: float) -> list[uuid.UUID]:
        """pending -> deleting for these cards, if they are still pending past `ttl_seconds`.

        For cards whose upload the sweeper did not find (`pending_due` first): the purge of
        deleted cards then removes their bytes and rows, after its guard interval. Safe to
        repeat and to race a confirm: whichever commits first decides, and the other
        changes nothing.
        """
        if not ids:
            return []
        rows = await self._rows("expire_pending", {
            "ids": list(ids), "ttl_seconds": ttl_seconds, "worker": self.worker})
        return [r["id"] for r in rows]

    async def restore_card(self, file_id: uuid.UUID, owner: str, *, key: str, version: str,
                           size: int, content_type: str) -> bool:
        """A card for a stored original that no card holds (`darkroom reconcile --restore`):
        made as the API makes one (created, then confirmed for exactly `version`, as bulk
        work) with its history saying `restored`, all in one transaction. A restore whose
        answer was lost made all of it or nothing: run again, it finds the original held,
        or makes the card then. Raises `psycopg.errors.UniqueViolation` when a card with
        this id exists (restored by another run just now)."""
        create = {"id": file_id, "owner": owner, "filename": str(file_id),
                  "content_type": content_type, "size": size, "original_key": key,
                  "sha256": None, "key_hash": None, "request_hash": None,
                  "priority": str(Priority.BULK)}
        moved = False
        async with self.db.transaction() as tx:
            await tx.rows("create_file", create)
            confirmed = await tx.row("confirm", {"id": file_id, "owner": owner,
                                                 "version": version, "sha256": None,
                                                 "size": size})
            moved = confirmed is not None and bool(confirmed["moved"])
            if not moved:
                raise psycopg.Rollback()  # a card never confirmed is not left behind
            await tx.rows("restored_card", {"id": file_id})
        return moved

    # --- attempts --------------------------------------------------------------------

    async def claim(self, n: int) -> list[Lease]:
        """Lease up to `n` claimable cards in one short transaction.

        Rows that were already started `max_attempts` times are moved to
        rejected/attempts_exhausted by the same statement and are not returned. A lease
        that ends without publishing has its objects (layout.ATTEMPT_KEYS) accounted for
        by the database, whatever statement ends it (migration 0020). Raises
        `ClaimUnknown` when the statement may have committed but its answer was lost: the
        caller adopts what it leased (`adopt_claim`) instead of leaving those rows to wait
        for their lease to expire with an attempt spent.
        """
        if n <= 0:
            return []
        claim_id = uuid.uuid4()
        try:
            return await self._leases("claim", self._claim_params(n, claim_id))
        except CONNECTION_ERRORS as exc:
            raise ClaimUnknown(claim_id) from exc

    def _claim_params(self, n: int, claim_id: uuid.UUID,
                      committing: Sequence[uuid.UUID] = ()) -> dict[str, Any]:
        return claim_params(n=n, claim=claim_id, max_attempts=self.max_attempts,
                            lease_seconds=self.lease_seconds, worker=self.worker,
                            bulk_share=self.bulk_share, committing=committing)

    async def complete_and_claim(self, results: Sequence[tuple[Lease, Derived]], n: int,
                                 claim_id: uuid.UUID | None = None, *,
                                 claimed: Callable[[list[Lease]], None] | None = None,
                                 ) -> tuple[set[uuid.UUID], list[Lease]]:
        """`complete_many`, then `claim(n)`: the worker claims the room a batch leaves
        with the batch's own commit.

        The batch's `publish` and the claim are sent in one round trip and commit
        together or not at all, each row still fenced by its token; the rows `publish`
        left (rare: a lost lease, a re-derive) then go through `complete` on their own.
        `claimed` is given the claim's leases as soon as it committed, before the rows
        left are sent: a caller stopped meanwhile knows them. Raises
        `ClaimUnknown` when the pair's answer was lost, or, without `claimed`, when the
        rows left did not answer after the claim committed: the commits are then repeated
        on their own (`complete_many` recognizes a repeat of one that went through), and
        what the claim leased is found by `adopt_claim`. With `claimed`, an error of the
        rows left is raised as it is. Any error of the pair rolled both back.
        """
        claim_id = claim_id or uuid.uuid4()
        try:
            published, leases = await self.db.together(
                ("publish", self._complete_params(results), None),
                ("claim", self._claim_params(n, claim_id,
                                             [lease.file_id for lease, _ in results]), Lease))
        except CONNECTION_ERRORS as exc:
            raise ClaimUnknown(claim_id) from exc
        if claimed is not None:
            claimed(leases)
        try:
            lost = await self._complete_rest(results, {r["token"] for r in published})
        except Exception as exc:
            if claimed is not None:
                raise
            # The claim committed, but the commits left to `complete` did not answer:
            # the caller repeats the commits, and adopts the claim's leases by its id.
            raise ClaimUnknown(claim_id) from exc
        return lost, leases

    async def adopt_claim(self, claim_id: uuid.UUID) -> list[Lease]:
        """The leases a claim made whose answer was lost (none if it never committed)."""
        return await self._leases("adopt_claim", {"claim": claim_id, "worker": self.worker})

    async def heartbeat(self, leases: Sequence[Lease]) -> set[uuid.UUID]:
        """Extend every lease by `lease_seconds`; answers the tokens whose lease is lost.

        An attempt that already ended by its own statement is not reported lost.
        """
        if not leases:
            return set()
        rows = await self._rows("heartbeat", {
            "ids": [lease.file_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "lease_seconds": self.lease_seconds, "worker": self.worker,
        })
        return {r["token"] for r in rows}

    async def track_attempt_objects(self, lease: Lease, keys: Sequence[str]) -> None:
        """Track an unpublished attempt's objects anew, once its writes have returned: one
        that landed late is deleted a guard interval from now."""
        await self._rows("track_attempt_objects",
                         {"keys": list(keys), "id": lease.file_id, "token": lease.token})

    async def complete_many(self, results: Sequence[tuple[Lease, Derived]]) -> set[uuid.UUID]:
        """Fenced commit of several attempts; answers the tokens not published.

        Each row is still fenced by its own token. The common case goes in one statement
        (`publish`); only the rows it left take a second (`complete`), where a lost one
        records `lease_lost` and registers its object as an orphan, and never counts as
        success, a repeat of a commit that went through is recognized by the card's key
        (unique to the attempt) and answered as published, and a re-derive hands the
        derivative it replaces to the sweeper.
        """
        if not results:
            return set()
        published = await self._rows("publish", self._complete_params(results))
        return await self._complete_rest(results, {r["token"] for r in published})

    async def _complete_rest(self, results: Sequence[tuple[Lease, Derived]],
                             published: set[uuid.UUID]) -> set[uuid.UUID]:
        """`complete` for the results `publish` did not publish (a lost lease, a repeat
        of a commit that went through, a re-derive): answers the tokens not published."""
        rest = [(lease, derived) for lease, derived in results if lease.token not in published]
        if not rest:
            return set()
        rows = await self._rows("complete", self._complete_params(rest))
        return {r["token"] for r in rows}

    def _complete_params(self, results: Sequence[tuple[Lease, Derived]]) -> dict[str, Any]:
        return {
            "ids": [lease.file_id for lease, _ in results],
            "tokens": [lease.token for lease, _ in results],
            "keys": [d.key for _, d in results],
            "versions": [d.version for _, d in results],
            "sha256s": [d.sha256 for _, d in results],
            "widths": [d.width for _, d in results],
            "heights": [d.height for _, d in results],
            "sizes": [d.size for _, d in results],
            "thumb_keys": [d.thumb.key if d.thumb else None for _, d in results],
            "thumb_versions": [d.thumb.version if d.thumb else None for _, d in results],
            "thumb_sha256s": [d.thumb.sha256 if d.thumb else None for _, d in results],
            "thumb_widths": [d.thumb.width if d.thumb else None for _, d in results],
            "thumb_heights": [d.thumb.height if d.thumb else None for _, d in results],
            "thumb_sizes": [d.thumb.size if d.thumb else None for _, d in results],
            "thumbhashes": [d.thumbhash for _, d in results],
            "worker": self.worker, "fingerprint": self.fingerprint,
        }

    async def complete(self, lease: Lease, derived: Derived) -> None:
        """Publish one result; raises `LeaseLost` when the attempt lost its right to."""
        if await self.complete_many([(lease, derived)]):
            raise LeaseLost(lease.file_id, lease.token)

    async def fail(self, lease: Lease, code: ErrorCode) -> Status:
        """Record a failed attempt; answers the card's new status (`queued` or `rejected`,
        or `ready` for a re-derive that failed for good: the photo keeps its derivative).

        Transient codes requeue with backoff and full jitter while attempts remain; a
        transient failure of the last attempt rejects with that code. A repeat of a failure
        that was recorded answers what it did, and an attempt that already published
        answers `ready`. Raises `LeaseLost`.
        """
        transient = code in TRANSIENT_CODES
        delay = (
            backoff_delay(lease.attempt, self.retry_base_seconds, self.retry_cap_seconds,
                          self._rng)
            if transient else 0.0
        )
        rows = await self._rows("fail", {
            "id": lease.file_id, "token": lease.token, "transient": transient,
            "error_code": str(code), "max_attempts": self.max_attempts,
            "delay": delay, "worker": self.worker,
        })
        if not rows:
            raise LeaseLost(lease.file_id, lease.token)
        return Status(rows[0]["status"])

    async def defer(self, lease: Lease, code: ErrorCode, delay: float) -> None:
        """Hand a card back after `delay` with its attempt given back: the store failed,
        not the file. Raises `LeaseLost`; a repeat that went through is success."""
        rows = await self._rows("defer", {
            "id": lease.file_id, "token": lease.token, "delay": delay,
            "error_code": str(code), "worker": self.worker,
        })
        if not rows:
            raise LeaseLost(lease.file_id, lease.token)

    async def defer_counted(self, lease: Lease, code: ErrorCode) -> tuple[Status, int]:
        """`defer`, counted on the card: the store failed this file while it served others
        between the file's tries. The `max_deferrals`-th such deferral rejects the card
        with `code`; answers its new status and its count. Its backoff doubles with the
        count, with full jitter. Raises `LeaseLost`; a repeat that went through answers
        what it did."""
        rows = await self._rows("defer_counted", {
            "id": lease.file_id, "token": lease.token, "error_code": str(code),
            "max_deferrals": self.max_deferrals, "base": self.retry_base_seconds,
            "cap": self.retry_cap_seconds, "jitter": self._rng.random(),
            "worker": self.worker,
        })
        if not rows:
            raise LeaseLost(lease.file_id, lease.token)
        return Status(rows[0]["status"]), int(rows[0]["deferrals"])

    async def release(self, leases: Sequence[Lease],
                      unstarted: Collection[uuid.UUID] = ()) -> set[uuid.UUID]:
        """Hand unfinished leases back (queued, due now); answers the ids released
        (a repeat of a hand-back that went through counts as released). The leases whose
        token is in `unstarted` were never started: their attempt is given back."""
        if not leases:
            return set()
        rows = await self._rows("release", {
            "ids": [lease.file_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "unstarted": list(unstarted),
            "worker": self.worker,
        })
        return {r["id"] for r in rows}

    async def take_deleted(self, *, guard_seconds: float, limit: int,
                           retry_seconds: float) -> list[tuple[uuid.UUID, str]]:
        """A batch of cards deleted over `guard_seconds` ago, for one sweeper.

        Taking them commits at once (their next try moves `retry_seconds` ahead), so no
        lock is held while their bytes are deleted; a card whose bytes could not all be
        deleted is taken again after `retry_seconds`.
        """
        rows = await self._rows("take_deleted", {
            "guard_seconds": guard_seconds, "limit": limit, "retry_seconds": retry_seconds})
        return [(r["id"], r["original_key"]) for r in rows]

    async def purge_card(self, file_id: uuid.UUID) -> None:
        """deleting -> gone, once every byte of the card is deleted. Safe to repeat."""
        await self._rows("purge_card", {"id": file_id})

    async def pause_worker(self, reason: str) -> None:
        """Record (or refresh) that this worker stopped claiming; safe to repeat."""
        await self._rows("pause_worker", {"worker": self.worker, "reason": reason})

    async def resume_worker(self) -> None:
        await self._rows("resume_worker", {"worker": self.worker})

    # --- re-derive -------------------------------------------------------------------

    async def rederive(self, owner: str, fingerprint: str, limit: int = 500) -> int:
        """ready -> queued (bulk) for up to `limit` of `owner`'s stale cards; answers how
        many moved. Safe to repeat: only cards still ready and stale are taken."""
        rows = await self._rows("rederive", {"owner": owner, "fingerprint": fingerprint,
                                             "limit": limit})
        return int(rows[0]["n"])

    # --- retry ------------------------------------------------------------------------

    async def retry(
        self, owner: str, *, run: uuid.UUID, actor: str, codes: Sequence[str] | None,
        since: datetime | None = None, file_id: uuid.UUID | None = None,
        ids: Sequence[uuid.UUID] | None = None, priority: Priority = Priority.BULK,
        limit: int = 500,
    ) -> list[uuid.UUID]:
        """rejected -> queued with a fresh attempt budget, for up to `limit` of `owner`'s
        rejected cards (only `file_id`, or those of `ids`, when given) with a code in
        `codes` (None: any); answers the ids moved. Fenced by `run`: repeated with the
        same run (its answer lost), it re-queues nothing it re-queued before."""
        rows = await self._rows("retry", {
            "owner": owner, "id": file_id, "ids": None if ids is None else list(ids),
            "codes": None if codes is None else list(codes),
            "since": since, "run": run, "actor": actor, "priority": str(Priority(priority)),
            "limit": limit})
        return list(rows[0]["ids"])


async def _within_quota(tx: Statements, owner: str, size: int, quota_files: int,
                        quota_bytes: int, key_hash: bytes | None = None) -> bool:
    """In the caller's transaction: take the owner's quota lock (so two creates cannot
    both fit into the last free place), then answer whether one more card of `size` fits,
    or the owner already holds `key_hash` (the create then makes no card: a replay)."""
    await tx.rows("lock_owner_quota", {"owner": owner})
    fits = await tx.row("owner_within_quota", {
        "owner": owner, "size": size, "quota_files": quota_files, "quota_bytes": quota_bytes,
        "key_hash": key_hash})
    return bool(fits and fits["fits"])
