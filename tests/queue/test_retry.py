"""A way back from `rejected`, and re-derives whose failure keeps the photo ready, against
a real PostgreSQL."""

from __future__ import annotations

import hashlib
import io
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from darkroom import retry
from darkroom.config import ConfigError, Settings
from darkroom.db.queries import QUERIES
from darkroom.errors import RETRYABLE_CODES, ErrorCode
from darkroom.queue import Derived, Lease, Priority, Queue, derived_key
from darkroom.reads import Reads
from darkroom.uploads import Uploads
from tests.support.services import confirm, make_queue
from tests.support.sql import SQL

CODES = sorted(RETRYABLE_CODES)


def derived_for(lease: Lease) -> Derived:
    return Derived(key=derived_key(lease), version="dv", sha256="ab" * 32,
                   width=10, height=8, size=123)


def row(db_url: str, file_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        found = conn.execute(SQL["card"], {"id": file_id}).fetchone()
    assert found is not None
    return found


def events(db_url: str, file_id: uuid.UUID) -> list[tuple[str, str | None, str | None]]:
    with psycopg.connect(db_url) as conn:
        return [(k, w, c) for k, w, c in conn.execute(
            SQL["event_log"], {"id": file_id}).fetchall()]


def expire(db_url: str, file_id: uuid.UUID) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["expire_lease"], {"id": file_id})


async def queued(q: Queue, owner: str = "alice", sha256: str | None = None) -> uuid.UUID:
    card = await q.create_file_keyed(owner=owner, filename="a.jpg",
                                     content_type="image/jpeg", size=10, sha256=sha256)
    assert card is not None
    done = await q.confirm_card(card.id, owner, "v1", sha256=sha256)
    assert done.card is not None
    return card.id


async def rejected(q: Queue, code: ErrorCode, owner: str = "alice") -> uuid.UUID:
    """A card rejected with `code`, on its only attempt (max_attempts 1)."""
    fid = await queued(q, owner)
    [lease] = await q.claim(1)
    assert lease.file_id == fid
    assert await q.fail(lease, code) == "rejected"
    return fid


async def test_retry_requeues_retryable_rejected_cards_once_with_a_fresh_budget(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=1)
    storage = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    timeout = await rejected(q, ErrorCode.PROCESSING_TIMEOUT)
    corrupt = await rejected(q, ErrorCode.INVALID_IMAGE)
    # Attempts exhausted: its only lease ran out.
    exhausted = await queued(q)
    assert [x.file_id for x in await q.claim(1)] == [exhausted]
    expire(db_url, exhausted)
    assert await q.claim(1) == []
    assert row(db_url, exhausted)["error_code"] == "attempts_exhausted"
    other = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE, owner="bob")
    waiting = await queued(q)

    assert await Reads(q.db).retry_candidates(owner=None, codes=CODES, since=None) == {
        ("alice", "attempts_exhausted"): 1, ("alice", "processing_timeout"): 1,
        ("alice", "storage_unavailable"): 1, ("bob", "storage_unavailable"): 1}
    run = uuid.uuid4()
    moved = await q.retry("alice", run=run, actor="cli:ops", codes=CODES)
    assert sorted(moved) == sorted([storage, timeout, exhausted])
    for fid in moved:
        r = row(db_url, fid)
        assert (r["status"], r["attempts"], r["error_code"], r["priority"]) == (
            "queued", 0, None, "bulk")
        assert r["finished_at"] is None and r["retried_by"] == run
    assert events(db_url, storage)[-1] == ("retried", "cli:ops", "storage_unavailable")
    assert events(db_url, exhausted)[-1] == ("retried", "cli:ops", "attempts_exhausted")
    # Untouched: a permanent code, another owner, a card that is not rejected.
    assert row(db_url, corrupt)["status"] == "rejected"
    assert row(db_url, other)["status"] == "rejected"
    assert row(db_url, waiting)["retried_by"] is None
    # Run again, nothing is queued twice.
    assert await q.retry("alice", run=run, actor="cli:ops", codes=CODES) == []
    assert await q.retry("alice", run=uuid.uuid4(), actor="cli:ops", codes=CODES) == []
    # A fresh budget: the retried cards run again, and publish.
    leases = await q.claim(10)
    assert {lease.file_id for lease in leases} == {waiting, storage, timeout, exhausted}
    assert all(lease.attempt == 1 for lease in leases)
    # Every code with `--all` (codes None).
    assert await q.retry("alice", run=uuid.uuid4(), actor="cli:ops", codes=None) == [corrupt]


async def test_a_retry_whose_answer_was_lost_queues_nothing_twice(
        pool: Any, db_url: str) -> None:
    """The statement committed and its answer was lost; meanwhile a card it re-queued was
    rejected again. Run again with the same run id, it takes nothing."""
    q = make_queue(pool, max_attempts=1)
    fid = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    run = uuid.uuid4()
    params = {"owner": "alice", "id": None, "ids": None, "codes": CODES, "since": None,
              "run": run, "actor": "cli:ops", "priority": "bulk", "limit": 500}
    with psycopg.connect(db_url, autocommit=True) as conn:  # committed; answer unread
        conn.execute(QUERIES["retry"], params)
    [lease] = await q.claim(1)
    assert await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE) == "rejected"
    assert await q.retry("alice", run=run, actor="cli:ops", codes=CODES) == []
    assert [k for k, _, _ in events(db_url, fid)].count("retried") == 1
    # Another run is another request: it takes the card back.
    assert await q.retry("alice", run=uuid.uuid4(), actor="cli:ops", codes=CODES) == [fid]


async def test_retry_since_takes_only_cards_rejected_from_then_on(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=1)
    old = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_rejection"], {"id": old})
        [(now,)] = conn.execute(SQL["an_hour_ago"]).fetchall()
    new = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    assert await q.retry("alice", run=uuid.uuid4(), actor="a", codes=CODES,
                         since=now) == [new]
    assert row(db_url, old)["status"] == "rejected"


async def test_retried_cards_join_their_owners_bulk_line(pool: Any, db_url: str) -> None:
    """Stamped as re-derives are: an owner's retried cards do not jump ahead of another
    owner's bulk work waiting at the head of the class."""
    q = make_queue(pool, max_attempts=1)
    mine = [await rejected(q, ErrorCode.STORAGE_UNAVAILABLE) for _ in range(3)]
    theirs = []
    for _ in range(2):
        card = await q.create_file(owner="bob", filename="b.jpg", content_type="image/jpeg",
                                   size=1, priority=Priority.BULK)
        await confirm(q, card.id, "bob", "v1")
        theirs.append(card.id)
    assert len(await q.retry("alice", run=uuid.uuid4(), actor="a", codes=CODES)) == 3
    order = [lease.file_id for lease in await q.claim(5)]
    # Alice's line starts at the class's head, beside Bob's: the owners alternate.
    owners = ["alice" if f in mine else "bob" for f in order]
    assert owners[:4].count("alice") == 2 and owners[:4].count("bob") == 2


async def test_an_owner_retries_one_card_only_when_it_is_rejected_for_a_transient_code(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=1)
    fid = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    corrupt = await rejected(q, ErrorCode.INVALID_IMAGE)
    assert (await retry.retry_card(q, fid, "bob", "api:dk_x")).outcome == "not_found"
    assert row(db_url, fid)["status"] == "rejected"
    assert (await retry.retry_card(q, corrupt, "alice", "api:dk_x")).outcome == \
        "not_retryable"
    done = await retry.retry_card(q, fid, "alice", "api:dk_x")
    assert done.outcome == "queued" and done.card is not None
    assert done.card.status == "queued" and done.card.priority == "interactive"
    assert events(db_url, fid)[-1] == ("retried", "api:dk_x", "storage_unavailable")
    # Now queued: not rejected any more.
    again = await retry.retry_card(q, fid, "alice", "api:dk_x")
    assert again.outcome == "not_retryable" and again.card is not None
    assert [k for k, _, _ in events(db_url, fid)].count("retried") == 1


async def test_the_retry_command_fences_its_run_and_reports(
        pool: Any, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = make_queue(pool, max_attempts=1)
    a = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    b = await rejected(q, ErrorCode.INVALID_IMAGE, owner="bob")
    monkeypatch.setenv("DARKROOM_DATABASE_URL", db_url)
    settings = Settings(data_dir=tmp_path)
    out = io.StringIO()
    assert await retry.run(settings, owner=None, codes=None, everyone=False, since=None,
                           dry_run=True, wait=False, out=out) == 0
    assert "1 rejected card(s)" in out.getvalue() and row(db_url, a)["status"] == "rejected"
    out = io.StringIO()
    run_id = uuid.uuid4()
    assert await retry.run(settings, owner=None, codes=["invalid_image"], everyone=False,
                           since=None, dry_run=False, wait=False, out=out,
                           run_id=run_id) == 0
    assert "queued 1 retry(s)" in out.getvalue()
    assert row(db_url, b)["status"] == "queued" and row(db_url, a)["status"] == "rejected"
    assert events(db_url, b)[-1][0:2] == ("retried", retry.cli_actor())
    with pytest.raises(ConfigError, match="--code 'nope'"):
        retry.parse_codes(["nope"], everyone=False)
    with pytest.raises(ConfigError, match="--since"):
        retry.parse_since("yesterday")


# --- re-derives that fail ------------------------------------------------------------


async def ready_card(q: Queue, sha256: str) -> tuple[uuid.UUID, Lease]:
    fid = await queued(q, sha256=sha256)
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    return fid, lease


async def test_a_failed_rederive_keeps_the_photo_ready_and_is_tried_again(
        pool: Any, db_url: str) -> None:
    digest = hashlib.sha256(b"photo").hexdigest()
    old = make_queue(pool, fingerprint="old")
    fid, first = await ready_card(old, digest)
    q = make_queue(pool, fingerprint="new")
    assert await q.rederive("alice", "new") == 1
    [lease] = await q.claim(1)
    assert await q.fail(lease, ErrorCode.INVALID_IMAGE) == "ready"
    r = row(db_url, fid)
    assert (r["status"], r["error_code"], r["rederive_error"]) == (
        "ready", None, "invalid_image")
    assert r["derived_key"] == derived_key(first) and r["derive_fingerprint"] == "old"
    assert events(db_url, fid)[-1] == ("rederive_failed", "test", "invalid_image")
    card = await Reads(q.db).get_file(fid, "alice")
    assert card is not None and card.rederive_error == "invalid_image"
    # The failure is answered again if the statement is repeated (its answer lost).
    assert await q.fail(lease, ErrorCode.INVALID_IMAGE) == "ready"
    assert [k for k, _, _ in events(db_url, fid)].count("lease_lost") == 0
    # Duplicate detection still finds the photo by its bytes.
    known = await Uploads(q.db).known_original("alice", digest)
    assert known is not None and known.id == fid
    # The next `darkroom rederive` takes it again; a success clears the error.
    assert await Reads(q.db).rederive_owners("new") == {"alice": 1}
    assert await q.rederive("alice", "new") == 1
    [again] = await q.claim(1)
    await q.complete(again, derived_for(again))
    r = row(db_url, fid)
    assert r["rederive_error"] is None and r["derive_fingerprint"] == "new"


async def test_a_rederive_out_of_attempts_keeps_the_photo_ready(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=1, fingerprint="new")
    fid, first = await ready_card(make_queue(pool, fingerprint="old"), "cd" * 32)
    assert await q.rederive("alice", "new") == 1
    [lease] = await q.claim(1)
    expire(db_url, fid)
    assert await q.claim(1) == []
    r = row(db_url, fid)
    assert (r["status"], r["error_code"], r["rederive_error"]) == (
        "ready", None, "attempts_exhausted")
    assert r["derived_key"] == derived_key(first) and r["lease_token"] is None
    assert events(db_url, fid)[-1][0::2] == ("rederive_failed", "attempts_exhausted")
    # A transient failure of the last attempt, likewise.
    assert await q.rederive("alice", "new") == 1
    [lease] = await q.claim(1)
    assert await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE) == "ready"
    assert row(db_url, fid)["rederive_error"] == "storage_unavailable"


async def test_a_timeout_recorded_after_its_own_commit_is_not_a_lost_lease(
        pool: Any, db_url: str) -> None:
    """The attempt published, then its timeout is recorded (the two raced): the failure
    statement recognizes the attempt's own publication."""
    q = make_queue(pool)
    fid = await queued(q)
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    assert await q.fail(lease, ErrorCode.PROCESSING_TIMEOUT) == "ready"
    assert [k for k, _, _ in events(db_url, fid)] == ["claimed", "ready"]
    assert row(db_url, fid)["status"] == "ready"


def test_the_retry_command_line() -> None:
    from darkroom.cli import build_parser

    args = build_parser().parse_args(
        ["retry", "--owner", "o", "--code", "storage_unavailable", "--code", "invalid_image",
         "--since", "2026-12-03T10:00", "--dry-run", "--wait"])
    assert (args.owner, args.code, args.since, args.all, args.dry_run, args.wait) == (
        "o", ["storage_unavailable", "invalid_image"], "2026-12-03T10:00", False, True, True)
    since = retry.parse_since("2026-12-03T10:00")
    assert since is not None and since.utcoffset() is not None and since.hour == 10
    assert retry.parse_codes(None, everyone=True) is None
    assert retry.parse_codes(None, everyone=False) == CODES
    with pytest.raises(ConfigError, match="either --all or --code"):
        retry.parse_codes(["invalid_image"], everyone=True)


async def test_a_card_rejected_at_the_deferral_bound_is_retried_with_a_fresh_count(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_deferrals=2)
    fid = await queued(q)
    for _ in range(2):
        [lease] = await q.claim(1)
        await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE)
    assert (row(db_url, fid)["status"], row(db_url, fid)["deferrals"]) == ("rejected", 2)
    assert await q.retry("alice", run=uuid.uuid4(), actor="a", codes=CODES) == [fid]
    r = row(db_url, fid)
    assert (r["status"], r["attempts"], r["deferrals"]) == ("queued", 0, 0)
    # One counted deferral now only queues it again.
    [lease] = await q.claim(1)
    assert (await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE))[0] == "queued"


async def test_a_rederive_at_the_deferral_bound_keeps_the_photo_ready(
        pool: Any, db_url: str) -> None:
    fid, first = await ready_card(make_queue(pool, fingerprint="old"), "ef" * 32)
    q = make_queue(pool, fingerprint="new", max_deferrals=1)
    assert await q.rederive("alice", "new") == 1
    [lease] = await q.claim(1)
    assert (await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE))[0] == "ready"
    assert (await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE))[0] == "ready"
    r = row(db_url, fid)
    assert (r["status"], r["error_code"], r["rederive_error"]) == (
        "ready", None, "storage_unavailable")
    assert r["derived_key"] == derived_key(first)
    kinds = [k for k, _, _ in events(db_url, fid)]
    assert kinds[-1] == "rederive_failed" and "lease_lost" not in kinds


async def test_a_picked_retry_takes_only_the_named_cards_of_each_owner(
        pool: Any, db_url: str) -> None:
    """An admin's picked retry: only the ids named, across owners, each in its owner's
    line; run again after the first owner's statement committed and the answer was lost,
    it finishes the rest and queues nothing twice."""
    q = make_queue(pool, max_attempts=1)
    a1 = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    a2 = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    b1 = await rejected(q, ErrorCode.PROCESSING_TIMEOUT, owner="bob")
    # Alice's statement of an earlier request committed; its answer was lost.
    assert await q.retry("alice", run=uuid.uuid4(), actor="api:x owner=ops", ids=[a1],
                         codes=CODES) == [a1]

    done = await retry.retry_picked(q, [a1, b1], actor="api:x owner=ops")
    assert [(d.id, d.outcome, d.status) for d in done] == [
        (a1, retry.RetryOutcome.NOT_REJECTED, "queued"),
        (b1, retry.RetryOutcome.QUEUED, "queued")]
    assert row(db_url, a2)["status"] == "rejected"  # alice's, but not picked
    assert row(db_url, b1)["priority"] == "bulk"
    assert [k for k, _, _ in events(db_url, a1)].count("retried") == 1
    assert events(db_url, b1)[-1] == ("retried", "api:x owner=ops", "processing_timeout")
    with pytest.raises(ValueError, match="at most 500"):
        await retry.retry_picked(q, [uuid.uuid4() for _ in range(501)], actor="x")


async def test_a_picked_retry_reads_the_cards_once_and_again_only_those_taken_meanwhile(
        pool: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picked cards are read once. A card read as retryable that another request
    retries before this one's statement is read again, and answered where it went."""
    q = make_queue(pool, max_attempts=1)
    a = await rejected(q, ErrorCode.STORAGE_UNAVAILABLE)
    b = await rejected(q, ErrorCode.PROCESSING_TIMEOUT, owner="bob")
    corrupt = await rejected(q, ErrorCode.INVALID_IMAGE, owner="bob")
    reads: list[list[uuid.UUID]] = []
    targets = Reads.retry_targets

    async def read(self: Reads, ids: Any) -> Any:
        found = await targets(self, ids)
        reads.append(list(ids))
        return found

    monkeypatch.setattr(Reads, "retry_targets", read)
    picked = [a, corrupt, b]
    done = await retry.retry_picked(q, picked, actor="api:x owner=ops")
    assert [(d.outcome, d.status) for d in done] == [
        (retry.RetryOutcome.QUEUED, "queued"), (retry.RetryOutcome.NOT_RETRYABLE, "rejected"),
        (retry.RetryOutcome.QUEUED, "queued")]
    assert reads == [picked]

    # Rejected again; another admin's request takes b between this one's read and its
    # statement.
    for lease in await q.claim(5):
        assert await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE) == "rejected"
    reads.clear()

    async def raced(self: Reads, ids: Any) -> Any:
        found = await read(self, ids)
        if len(reads) == 1:
            assert await q.retry("bob", run=uuid.uuid4(), actor="api:y owner=other",
                                 ids=[b], codes=CODES) == [b]
        return found

    monkeypatch.setattr(Reads, "retry_targets", raced)
    done = await retry.retry_picked(q, picked, actor="api:x owner=ops")
    assert [(d.outcome, d.status) for d in done] == [
        (retry.RetryOutcome.QUEUED, "queued"), (retry.RetryOutcome.NOT_RETRYABLE, "rejected"),
        (retry.RetryOutcome.NOT_REJECTED, "queued")]
    assert reads == [picked, [b]]
    assert [w for k, w, _ in events(db_url, b) if k == "retried"] == [
        "api:x owner=ops", "api:y owner=other"]
