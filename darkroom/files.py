"""The upload flow: a card made, its original stored, the card confirmed for that version.

What `POST /v1/files`, `PUT /v1/files/{id}/content` and `POST /v1/files/{id}/confirm`
do, apart from HTTP. Each step answers one outcome, a frozen dataclass; the API only
translates it into a status and a problem code, so the flow is tested without HTTP.
Status changes stay in `queue.py`; idempotency keys and known digests are `uploads.py`'s.

Every card is looked up by (id, owner): another owner's card and a missing one are the
same `NotFound`.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import uuid
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from anyio import to_thread

from darkroom import uploads
from darkroom.card import Card, Priority, Status
from darkroom.config import Settings
from darkroom.errors import ObjectMissing, StorageError, StorageUnavailable
from darkroom.layout import original_key
from darkroom.queue import Confirmation, ConfirmOutcome, Queue, QuotaExceeded
from darkroom.reads import Reads
from darkroom.storage import ObjectInfo, ObjectStore, PresignedRequest

log = logging.getLogger(__name__)

# Uploaded bodies up to this size stay in memory while spooled; larger ones go to disk.
SPOOL_MEMORY = 1024 * 1024
# An upload URL never outlives its card's guard interval: a URL still valid after the
# sweeper purged a deleted card would let bytes land that no card accounts for.
PRESIGN_PUT_SECONDS = 900


@dataclass(frozen=True, slots=True)
class NewUpload:
    """What a client says about the file it is about to upload."""

    filename: str
    content_type: str
    size: int
    priority: Priority = Priority.INTERACTIVE
    sha256: str | None = None  # claimed; trusted for nothing until confirm has hashed
    allow_duplicate: bool = False  # with sha256: a new card even if the bytes are known

    def fingerprint(self) -> dict[str, Any]:
        """What makes two creates "the same request" for an idempotency key: what the
        card is and what the client asked about it. The priority (a scheduling hint of
        `darkroom import --bulk`) is not in it: the same file sent again with another
        hint is still the same create."""
        return {"filename": self.filename, "content_type": self.content_type,
                "size": self.size, "sha256": self.sha256,
                "allow_duplicate": self.allow_duplicate}


# --- outcomes ----------------------------------------------------------------------------
# Shared by the steps.


@dataclass(frozen=True, slots=True)
class NotFound:
    """No such card of this owner (or it is being deleted)."""


@dataclass(frozen=True, slots=True)
class TooLarge:
    """Past the upload limit (`DARKROOM_MAX_UPLOAD_BYTES`)."""

    limit: int


@dataclass(frozen=True, slots=True)
class SizeMismatch:
    """The stored bytes are not the size the card declared; the card stays pending."""


# Of create.


@dataclass(frozen=True, slots=True)
class Created:
    """A new pending card, and where its original goes: a request straight to the store,
    or (None) through the API's own upload."""

    card: Card
    upload: PresignedRequest | None


@dataclass(frozen=True, slots=True)
class Replayed:
    """The card an earlier create with the same key made, as it is now. While it is still
    pending, where its original goes (as `Created`), and the newest stored version with
    the declared size if there is one: the client that made it may have been cut off
    before it could confirm."""

    card: Card
    upload: PresignedRequest | None = None
    uploaded_version: str | None = None


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The owner's live card whose confirmed original has the claimed digest: nothing to
    upload."""

    card: Card


@dataclass(frozen=True, slots=True)
class Throttled:
    """Too many creates with this key; `retry_after` seconds until the next."""

    retry_after: int


@dataclass(frozen=True, slots=True)
class OverQuota:
    """The card would take the owner past a quota (0: that quota is off)."""

    quota_files: int
    quota_bytes: int


@dataclass(frozen=True, slots=True)
class InvalidKey:
    """The idempotency key is not 1 to 255 printable ASCII characters."""


@dataclass(frozen=True, slots=True)
class ReusedKey:
    """The owner used this idempotency key before for a different request."""


@dataclass(frozen=True, slots=True)
class BusyKey:
    """The key changed hands on every round (a create racing deletes): try again."""


CreateAnswer = (Created | Replayed | Duplicate | TooLarge | Throttled | OverQuota | InvalidKey
            | ReusedKey | BusyKey)

# Of a direct upload.


@dataclass(frozen=True, slots=True)
class Stored:
    """The upload is the original's newest version; the earlier ones are gone."""

    version: str


@dataclass(frozen=True, slots=True)
class AlreadyConfirmed:
    """The card is past pending: its original is fixed."""


@dataclass(frozen=True, slots=True)
class Empty:
    """No bytes came."""


StoreAnswer = Stored | NotFound | AlreadyConfirmed | TooLarge | Empty | SizeMismatch

# Of confirm.


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The card is queued for this version (now, or by an earlier confirm of it), as it is
    now. `tidy` is work to run once the answer is sent (None: none): the store's other
    versions of the original, which a presigned URL used twice may have left."""

    card: Card
    tidy: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Conflict:
    """The card was confirmed before with another version."""


@dataclass(frozen=True, slots=True)
class VersionNotFound:
    """The store never gave out this version of the card's original."""


@dataclass(frozen=True, slots=True)
class DigestMismatch:
    """The stored bytes do not have the digest claimed at create; they are deleted and
    the card stays pending for the right upload."""


ConfirmAnswer = (Confirmed | NotFound | Conflict | TooLarge | VersionNotFound | SizeMismatch
                 | DigestMismatch)


class Files:
    """The upload flow over one queue and one store. Safe to share among the tasks of
    one event loop; store calls run in worker threads."""

    def __init__(self, queue: Queue, store: ObjectStore, settings: Settings) -> None:
        self.queue = queue
        self.store = store
        self.reads = Reads(queue.db)
        self.uploads = uploads.Uploads(queue.db)
        self.max_upload_bytes = settings.max_upload_bytes
        self.quota_files = settings.owner_quota_files
        self.quota_bytes = settings.owner_quota_bytes
        self.presign_seconds = max(1, min(PRESIGN_PUT_SECONDS,
                                          int(settings.sweep_guard_seconds)))

    # --- create --------------------------------------------------------------------------

    async def create(
        self, owner: str, new: NewUpload, *, key: str | None = None,
        throttle: Callable[[], int] | None = None,
    ) -> CreateAnswer:
        """A card for `new`, in order: refused past the upload limit; `throttle` asked
        (seconds to wait, 0: go); with an idempotency `key` the owner used before for the
        same request, that key's card; with a claimed `sha256`, the owner's live card
        with those bytes unless a duplicate is allowed; else a new card within the
        owner's quotas (the key recorded with it in the same statement)."""
        if new.size > self.max_upload_bytes:
            return TooLarge(self.max_upload_bytes)
        wait = throttle() if throttle is not None else 0
        if wait:
            return Throttled(wait)
        if new.sha256 is None and key is None:
            try:
                card = await self.queue.create_file(
                    owner=owner, filename=new.filename, content_type=new.content_type,
                    size=new.size, quota_files=self.quota_files,
                    quota_bytes=self.quota_bytes, priority=new.priority)
            except QuotaExceeded:
                return OverQuota(self.quota_files, self.quota_bytes)
            return Created(card, await self._upload_target(card))
        if key is not None and not uploads.valid_key(key):
            return InvalidKey()
        try:
            made = await self.uploads.create(
                self.queue, owner=owner, filename=new.filename,
                content_type=new.content_type, size=new.size, sha256=new.sha256,
                allow_duplicate=new.allow_duplicate, key=key, fields=new.fingerprint(),
                priority=new.priority, quota_files=self.quota_files,
                quota_bytes=self.quota_bytes)
        except QuotaExceeded:
            return OverQuota(self.quota_files, self.quota_bytes)
        except uploads.KeyReused:
            return ReusedKey()
        except uploads.KeyBusy:
            return BusyKey()
        card = made.card
        if made.duplicate:
            return Duplicate(card)
        if not made.replayed:
            return Created(card, await self._upload_target(card))
        if card.status is not Status.PENDING:  # repeated after the card was confirmed
            return Replayed(card)
        uploaded = None
        if card.original_sha256 is not None:
            uploaded = await self._complete_upload(card)
        return Replayed(card, await self._upload_target(card), uploaded)

    async def _upload_target(self, card: Card) -> PresignedRequest | None:
        content_type, size = card.content_type, card.size_bytes
        return await to_thread.run_sync(lambda: self.store.presign_put(
            card.original_key, content_type=content_type, expires=self.presign_seconds,
            size=size))

    async def _complete_upload(self, card: Card) -> str | None:
        """The newest stored version of a pending card's original when it has the
        declared size."""
        store, key = self.store, card.original_key

        def newest() -> str | None:
            for obj in store.list(key):
                if obj.key == key:  # versions of one key come newest first
                    return obj.version if obj.size == card.size_bytes else None
            return None

        try:
            return await to_thread.run_sync(newest)
        except StorageError:  # down, or no permission to list versions
            return None  # the client simply uploads again

    # --- a direct upload -----------------------------------------------------------------

    async def store_content(
        self, file_id: uuid.UUID, owner: str, body: AsyncIterable[bytes],
        declared: int | None = None,
    ) -> StoreAnswer:
        """The original of a pending card, taken through the API (a store that signs no
        URLs). `declared` is the length the client announced: past the limit, refused
        before a byte is read. The count stops the upload as soon as it passes the
        limit, whatever was announced. Only the newest upload is kept: the earlier ones
        can never be confirmed usefully, and would otherwise let one card fill the store.
        `StorageError` when the store fails."""
        card = await self.reads.get_file(file_id, owner)
        if card is None:
            return NotFound()
        if card.status is not Status.PENDING:
            return AlreadyConfirmed()
        limit = self.max_upload_bytes
        if declared is not None and declared > limit:
            return TooLarge(limit)
        store, key = self.store, card.original_key
        # Spooled: a small body stays in memory, a big one goes to a temporary file.
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY) as spool:
            received = 0
            async for chunk in body:
                received += len(chunk)
                if received > limit:
                    return TooLarge(limit)
                spool.write(chunk)
            if received == 0:
                return Empty()
            if received != card.size_bytes:
                return SizeMismatch()
            spool.seek(0)
            version = await to_thread.run_sync(
                lambda: store.put(key, cast(BinaryIO, spool), content_type=card.content_type))
        log.info("original stored", extra={"file_id": str(card.id), "bytes": received})
        await to_thread.run_sync(lambda: drop_versions(store, key, older_than=version))
        return Stored(version)

    # --- confirm -------------------------------------------------------------------------

    async def confirm(self, file_id: uuid.UUID, owner: str, version: str) -> ConfirmAnswer:
        """Queue the card for exactly `version` of its original; a repeat with the same
        version answers the card again. A card created with a claimed digest is queued
        only if the stored bytes have it. Refused bytes (too large, wrong size, wrong
        digest) are deleted at once, not left to go with the card. `StorageError` when
        the store fails where the answer depends on it."""
        limit = self.max_upload_bytes
        # The common case takes two steps and never reads the card first: the named
        # version exists and fits, then one statement checks owner and status, moves the
        # card and answers it. The key is the one a card of this owner gets; a card made
        # before owners were in the key has another, found on the card when the first
        # look misses.
        key = original_key(file_id, owner)
        try:
            info: ObjectInfo | None = await self._head(key, version)
        except (ObjectMissing, StorageUnavailable):
            info = None
        if info is None or info.size > limit:
            # Decided from the card: a repeat stays idempotent even if the original has
            # since gone (the worker will report that as original_missing) or the store
            # is down.
            card = await self.reads.get_file(file_id, owner)
            if card is None:
                return NotFound()
            if card.status is not Status.PENDING:
                if card.original_version == version:
                    return Confirmed(card)
                return Conflict()
            key = card.original_key
            if info is None:
                try:  # again, for the precise answer: a missing version, or an outage
                    info = await self._head(key, version)
                except ObjectMissing:
                    return VersionNotFound()
            if info.size > limit:
                await self._drop(key, version)
                return TooLarge(limit)
        done = await self.queue.confirm_card(file_id, owner, version, size=info.size)
        if done.outcome is ConfirmOutcome.DIGEST_REQUIRED and done.claimed_sha256 is not None:
            checked = await self._confirm_digest(file_id, owner, key, version,
                                                 done.claimed_sha256, info.size)
            if not isinstance(checked, Confirmation):
                return checked
            done = checked
        if done.outcome is ConfirmOutcome.NOT_FOUND:
            return NotFound()
        if done.outcome is ConfirmOutcome.CONFLICT:
            return Conflict()
        if done.outcome is ConfirmOutcome.SIZE_MISMATCH:
            await self._drop(key, version)
            return SizeMismatch()
        tidy = None
        if done.outcome is ConfirmOutcome.QUEUED and not self.store.inline_head:
            # Only the confirmed version is kept: a presigned URL may have been used more
            # than once. (The local store takes uploads only through `store_content`,
            # which already keeps just the latest.)
            tidy = functools.partial(drop_versions, self.store, key, keep=version)
        card = done.card
        if card is None:  # confirmed before with this version (maybe concurrently)
            card = await self.reads.get_file(file_id, owner)
            if card is None:  # deleted in between
                return NotFound()
        return Confirmed(card, tidy)

    async def _confirm_digest(
        self, file_id: uuid.UUID, owner: str, key: str, version: str, claimed: str,
        size: int,
    ) -> Confirmation | VersionNotFound | DigestMismatch:
        """The card claimed a digest at create: hash the stored bytes, and confirm only if
        they are the claimed ones. Only cards created with a `sha256` pay for this read."""
        store = self.store
        try:
            actual = await to_thread.run_sync(lambda: store.digest(key, version))
        except ObjectMissing:
            return VersionNotFound()
        if actual != claimed:
            await self._drop(key, version)
            log.info("upload refused: digest mismatch", extra={"file_id": str(file_id)})
            return DigestMismatch()
        return await self.queue.confirm_card(file_id, owner, version, sha256=actual,
                                             size=size)

    async def _head(self, key: str, version: str) -> ObjectInfo:
        store = self.store
        if store.inline_head:
            return store.head(key, version)
        return await to_thread.run_sync(lambda: store.head(key, version))

    async def _drop(self, key: str, version: str) -> None:
        """A refused upload's bytes go now. Best effort: what a failure leaves goes with
        the card when it is deleted or expires."""
        store = self.store

        def drop() -> None:
            try:
                store.delete(key, version)
            except StorageError as exc:  # down, or no permission to delete versions
                log.warning("refused upload not deleted",
                            extra={"key": key, "error": type(exc).__name__})

        await to_thread.run_sync(drop)


def drop_versions(store: ObjectStore, key: str, *, older_than: str | None = None,
                  keep: str | None = None) -> None:
    """Delete the versions of `key` older than `older_than`, or every one but `keep`.

    Best effort: what a failure leaves goes with the card when it is deleted or expires.
    """
    try:
        versions = [v.version for v in store.list(key) if v.key == key]  # newest first
        if older_than is not None:
            if older_than not in versions:
                return
            doomed = versions[versions.index(older_than) + 1:]
        else:
            doomed = [v for v in versions if v != keep]
        for version in doomed:
            store.delete(key, version)
    except StorageError as exc:
        log.warning("superseded upload not deleted", extra={"key": key,
                                                            "error": type(exc).__name__})
