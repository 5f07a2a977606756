"""The lease protocol against a real PostgreSQL: each transition and its fencing."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.errors import ErrorCode
from darkroom.queue import (
    ConfirmOutcome,
    Derived,
    DerivedObject,
    Lease,
    LeaseLost,
    Queue,
    Status,
    backoff_delay,
    claim_params,
    derived_key,
    thumb_key,
)
from darkroom.reads import Reads
from darkroom.stats import read as read_stats
from tests.support.services import confirm, make_queue, sweepable_orphans, wait_for
from tests.support.sql import SQL


async def new_queued(q: Any, n: int = 1, owner: str = "alice") -> list[uuid.UUID]:
    ids = []
    for i in range(n):
        card = await q.create_file(owner=owner, filename=f"f{i}.jpg",
                                   content_type="image/jpeg", size=10)
        assert await confirm(q, card.id, owner, "v1") is ConfirmOutcome.QUEUED
        ids.append(card.id)
    return ids


def derived_for(lease: Any) -> Derived:
    return Derived(key=derived_key(lease), version="dv", sha256="ab" * 32,
                   width=10, height=8, size=123)


def expire(db_url: str, file_id: uuid.UUID) -> None:
    """Move a lease into the past: the controllable clock of these tests."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["expire_lease"], {"id": file_id})


def events(db_url: str, file_id: uuid.UUID) -> list[str]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(SQL["event_kinds"], {"id": file_id}).fetchall()
    return [r[0] for r in rows]


def orphans(db_url: str) -> list[tuple[str, uuid.UUID]]:
    """The keys the orphan sweep will delete (once past its guard interval)."""
    return sweepable_orphans(db_url)


def rows_written(db_url: str) -> list[Any]:
    """Whatever the protocol wrote for the sweeper, before any sweep: orphan rows and
    attempts recorded as ended unpublished."""
    with psycopg.connect(db_url) as conn:
        return (conn.execute(SQL["orphan_tokens"]).fetchall()
                + conn.execute(SQL["unpublished_attempts"]).fetchall())


def card(db_url: str, file_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(SQL["card"], {"id": file_id}).fetchone()
    assert row is not None
    return row


async def test_confirm_is_idempotent_and_fenced_by_version(pool: Any) -> None:
    q = make_queue(pool)
    c = await q.create_file(owner="alice", filename="a.jpg", content_type="image/jpeg", size=1)
    assert c.status is Status.PENDING
    assert await confirm(q, c.id, "bob", "v1") is ConfirmOutcome.NOT_FOUND
    assert await confirm(q, c.id, "alice", "v1") is ConfirmOutcome.QUEUED
    assert await confirm(q, c.id, "alice", "v1") is ConfirmOutcome.ALREADY
    assert await confirm(q, c.id, "alice", "v2") is ConfirmOutcome.CONFLICT
    assert await confirm(q, uuid.uuid4(), "alice", "v1") is ConfirmOutcome.NOT_FOUND


async def test_claim_complete_publishes_once(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(5)
    assert lease.file_id == fid and lease.attempt == 1 and lease.original_version == "v1"
    assert await q.claim(5) == []
    await q.complete(lease, derived_for(lease))
    row = card(db_url, fid)
    assert row["status"] == "ready" and row["lease_token"] is None
    assert row["derived_key"] == derived_key(lease)
    # The same commit again (its answer was lost) is the same success, and changes nothing.
    await q.complete(lease, derived_for(lease))
    assert card(db_url, fid)["finished_at"] == row["finished_at"]
    assert events(db_url, fid) == ["claimed", "ready"]
    assert orphans(db_url) == []


async def test_stale_commit_changes_nothing(pool: Any, db_url: str) -> None:
    q = make_queue(pool, lease_seconds=1.0)
    [fid] = await new_queued(q)
    [a] = await q.claim(1)
    expire(db_url, fid)
    [b] = await q.claim(1)
    assert b.file_id == fid and b.token != a.token and b.attempt == 2
    await q.complete(b, derived_for(b))
    with pytest.raises(LeaseLost):
        await q.complete(a, derived_for(a))
    row = card(db_url, fid)
    assert row["status"] == "ready" and row["derived_key"] == derived_key(b)
    assert events(db_url, fid) == ["claimed", "claimed", "ready", "lease_lost"]
    # Both of the stale attempt's keys, recorded when the rescue ended its lease; none of
    # b's.
    assert sorted(orphans(db_url)) == sorted([(derived_key(a), a.token),
                                              (thumb_key(a), a.token)])


async def test_crash_loop_ends_after_exactly_max_attempts(pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=3)
    [fid] = await new_queued(q)
    starts = 0
    for _ in range(10):
        leases = await q.claim(1)
        if not leases:
            break
        starts += 1
        expire(db_url, fid)  # the attempt "crashed": it never reports
    assert starts == 3
    row = card(db_url, fid)
    assert row["status"] == "rejected" and row["error_code"] == "attempts_exhausted"
    assert row["attempts"] == 3
    assert events(db_url, fid) == ["claimed"] * 3 + ["exhausted"]


async def test_revoke_during_processing_fences_the_commit(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.revoke(fid, "bob") is False
    assert await q.revoke(fid, "alice") is True
    assert await q.revoke(fid, "alice") is False
    with pytest.raises(LeaseLost):
        await q.complete(lease, derived_for(lease))
    assert await q.heartbeat([lease]) == {lease.token}
    row = card(db_url, fid)
    assert row["status"] == "deleting" and row["derived_key"] is None
    assert await Reads(q.db).get_file(fid, "alice") is None


async def test_permanent_failure_rejects_at_once(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.fail(lease, ErrorCode.INVALID_IMAGE) == "rejected"
    row = card(db_url, fid)
    assert row["error_code"] == "invalid_image" and row["attempts"] == 1
    stranger = dataclasses.replace(lease, token=uuid.uuid4())
    with pytest.raises(LeaseLost):
        await q.fail(stranger, ErrorCode.INVALID_IMAGE)


async def test_transient_failure_retries_then_rejects(pool: Any, db_url: str) -> None:
    q = make_queue(pool, max_attempts=3, retry_base_seconds=0.0)
    [fid] = await new_queued(q)
    outcomes = []
    for _ in range(3):
        [lease] = await q.claim(1)
        outcomes.append(await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE))
    assert outcomes == ["queued", "queued", "rejected"]
    row = card(db_url, fid)
    assert row["error_code"] == "storage_unavailable" and row["attempts"] == 3
    assert events(db_url, fid).count("retry_scheduled") == 2
    assert events(db_url, fid)[-1] == "exhausted"


async def test_transient_failure_waits_for_its_backoff(pool: Any, db_url: str) -> None:
    q = make_queue(pool, retry_base_seconds=600.0, retry_cap_seconds=600.0,
                   rng=random.Random(7))
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.fail(lease, ErrorCode.PROCESSING_TIMEOUT) == "queued"
    row = card(db_url, fid)
    delay = (row["available_at"] - row["updated_at"]).total_seconds()
    # Exactly the draw the queue made (the same seeded generator), and it is honoured.
    expected = backoff_delay(1, 600.0, 600.0, random.Random(7))
    assert expected > 1 and abs(delay - expected) < 0.01
    assert await q.claim(1) == []


def test_backoff_grows_and_is_jittered() -> None:
    rng = random.Random(1)
    base, cap = 2.0, 100.0
    for attempt in range(1, 10):
        ceiling = min(cap, base * 2 ** (attempt - 1))
        draws = [backoff_delay(attempt, base, cap, rng) for _ in range(2000)]
        assert all(0.0 <= d <= ceiling for d in draws)
        # full jitter: spread over the whole range, not clustered at the ceiling
        assert min(draws) < 0.05 * ceiling and max(draws) > 0.95 * ceiling
        assert 0.4 * ceiling < sum(draws) / len(draws) < 0.6 * ceiling


async def test_release_hands_back_due_now_and_keeps_the_count(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.release([lease]) == {fid}
    row = card(db_url, fid)
    assert row["status"] == "queued" and row["lease_token"] is None and row["attempts"] == 1
    [again] = await q.claim(1)
    assert again.attempt == 2


async def test_a_lease_handed_back_unstarted_gives_its_attempt_back(
        pool: Any, db_url: str) -> None:
    """A lease the worker kept ahead of a slot and never started is no start: handed back
    at every stop of a rolling deploy, the card still has all its attempts. One started
    and handed back with it keeps its count; a repeat of the hand-back takes nothing."""
    q = make_queue(pool, max_attempts=1)
    [kept, started] = await new_queued(q, 2)
    leases = {lease.file_id: lease for lease in await q.claim(2)}
    unstarted = [leases[kept].token]
    for _ in range(2):
        assert await q.release(list(leases.values()), unstarted) == {kept, started}
    assert card(db_url, kept)["attempts"] == 0
    assert card(db_url, started)["attempts"] == 1
    assert [lease.file_id for lease in await q.claim(2)] == [kept]
    assert card(db_url, started)["status"] == "rejected"

async def test_heartbeat_extends_only_the_holder(pool: Any, db_url: str) -> None:
    q = make_queue(pool, lease_seconds=5.0)
    [fid] = await new_queued(q)
    [a] = await q.claim(1)
    before = card(db_url, fid)["lease_until"]
    assert await q.heartbeat([a]) == set()
    assert card(db_url, fid)["lease_until"] >= before
    expire(db_url, fid)
    [b] = await q.claim(1)
    assert await q.heartbeat([a, b]) == {a.token}
    assert "lease_lost" in events(db_url, fid)


async def test_batch_claim_and_batch_complete(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    ids = await new_queued(q, 20)
    leases = await q.claim(8)
    assert len(leases) == 8 and len({lease.file_id for lease in leases}) == 8
    expire(db_url, leases[0].file_id)
    [stolen] = await q.claim(1)  # the expired lease is rescued first
    assert stolen.file_id == leases[0].file_id
    lost = await q.complete_many([(lease, derived_for(lease)) for lease in leases])
    assert lost == {leases[0].token}
    stats = (await read_stats(q.db)).to_json()
    assert stats["counts"]["ready"] == 7 and stats["counts"]["processing"] == 1
    assert stats["counts"]["queued"] == len(ids) - 8
    assert stats["lease_lost_total"] == 1 and stats["completed_last_minute"] == 7
    assert stats["oldest_claimable_age_seconds"] is not None
    assert stats["expired_leases"] == 0 and stats["rejected_share_1h"] == 0.0


async def test_stats_of_an_empty_queue(pool: Any) -> None:
    stats = (await read_stats(Database(pool))).to_json()
    assert stats["oldest_claimable_age_seconds"] is None
    assert stats["rejected_share_24h"] is None
    assert set(stats["counts"]) == {"pending", "queued", "processing", "ready", "rejected",
                                    "deleting"}


async def test_tokens_are_unique_per_row_and_per_claim(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q, 40)
    leases = await q.claim(40)
    assert len({lease.token for lease in leases}) == 40
    expire(db_url, leases[0].file_id)
    [again] = await q.claim(1)
    assert again.file_id == leases[0].file_id
    assert again.token not in {lease.token for lease in leases}


async def test_file_events_reads_the_whole_history(pool: Any, db_url: str) -> None:
    # Routine events are found by time, the rare ones by their index: together, every
    # event of the file and none of another's, in order.
    q = make_queue(pool, retry_base_seconds=0.0)
    [fid, other] = await new_queued(q, 2)
    first = {lease.file_id: lease for lease in await q.claim(2)}
    assert await q.fail(first[fid], ErrorCode.STORAGE_UNAVAILABLE) == "queued"
    await q.complete(first[other], derived_for(first[other]))
    [second] = await q.claim(1)
    await q.complete(second, derived_for(second))
    with pytest.raises(LeaseLost):
        await q.complete(first[fid], derived_for(first[fid]))
    history = await Reads(q.db).events(fid)
    assert [e.kind for e in history] == events(db_url, fid) == [
        "claimed", "retry_scheduled", "claimed", "ready", "lease_lost"]
    assert {e.file_id for e in history} == {fid}


async def test_listing_includes_processing_cards_in_order(pool: Any) -> None:
    # Processing cards are listed from the index of live leases, the rest from the owner's.
    q = make_queue(pool)
    ids = await new_queued(q, 6)
    leases = await q.claim(3)  # alice's first three
    await new_queued(q, 2, owner="bob")
    assert {lease.owner for lease in leases} == {"alice"}
    await q.complete(leases[0], derived_for(leases[0]))
    newest_first = list(reversed(ids))
    assert [r.id for r in await Reads(q.db).list_files("alice")] == newest_first
    pages: list[uuid.UUID] = []
    after = None
    while rows := await Reads(q.db).list_files("alice", limit=2, after=after):
        pages += [r.id for r in rows]
        after = (rows[-1].created_at, rows[-1].id)
    assert pages == newest_first
    processing = {lease.file_id for lease in leases[1:]}
    reads = Reads(q.db)
    assert {r.id for r in await reads.list_files("alice", status=Status.PROCESSING)} == processing
    ready = await reads.list_files("alice", status=Status.READY)
    assert [r.id for r in ready] == [leases[0].file_id]


async def test_cards_and_events_are_read_from_a_newer_schema(pool: Any, db_url: str) -> None:
    # Migrations only add, and a running process outlives the next one: columns it does not
    # know are left out of its cards and events, also by statements it prepared before.
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    assert await Reads(q.db).get_file(fid, "alice") is not None
    assert len(await Reads(q.db).events(fid)) == 2
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["add_later_columns"])
    got = await Reads(q.db).get_file(fid, "alice")
    assert got is not None and got.status is Status.READY and got.derived_key == derived_key(lease)
    assert [c.id for c in await Reads(q.db).list_files("alice")] == [fid]
    assert [e.kind for e in await Reads(q.db).events(fid)] == ["claimed", "ready"]
    [other] = await new_queued(q)  # create_file, and confirm's answer
    kept = await q.create_file(owner="alice", filename="b.jpg", content_type="image/jpeg",
                               size=1, quota_files=10, quota_bytes=0)
    assert kept is not None and kept.status is Status.PENDING
    assert {c.id for c in await Reads(q.db).list_files("alice")} == {fid, other, kept.id}


def derived_with_thumb(lease: Any) -> Derived:
    thumb = DerivedObject(key=thumb_key(lease), version="tv", sha256="cd" * 32,
                          width=4, height=3, size=45)
    return Derived(key=derived_key(lease), version="dv", sha256="ab" * 32,
                   width=10, height=8, size=123, thumb=thumb, thumbhash="1XgDfZQL9gh8")


async def test_claims_and_publications_write_nothing_for_the_sweeper(
        pool: Any, db_url: str) -> None:
    """The path every job takes, a claim and then its publication (with or without a
    thumb), writes no row for the sweeper: its objects are the card's."""
    q = make_queue(pool)
    await new_queued(q, 2)
    a, b = await q.claim(2)
    assert rows_written(db_url) == []
    await q.complete(a, derived_for(a))  # a photo small enough for no thumb
    await q.complete(b, derived_with_thumb(b))
    assert rows_written(db_url) == []


def both_keys(lease: Lease) -> list[tuple[str, uuid.UUID]]:
    return sorted([(derived_key(lease), lease.token), (thumb_key(lease), lease.token)])


async def _ends_by_failing(q: Queue, db_url: str, lease: Lease) -> None:
    await q.fail(lease, ErrorCode.INVALID_IMAGE)


async def _ends_by_failing_for_now(q: Queue, db_url: str, lease: Lease) -> None:
    assert await q.fail(lease, ErrorCode.PROCESSING_TIMEOUT) is Status.QUEUED


async def _ends_by_deferral(q: Queue, db_url: str, lease: Lease) -> None:
    await q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 60)


async def _ends_by_counted_deferral(q: Queue, db_url: str, lease: Lease) -> None:
    await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE)


async def _ends_by_hand_back(q: Queue, db_url: str, lease: Lease) -> None:
    assert await q.release([lease]) == {lease.file_id}


async def _ends_by_rescue(q: Queue, db_url: str, lease: Lease) -> None:
    expire(db_url, lease.file_id)
    [rescue] = await q.claim(1)
    assert rescue.file_id == lease.file_id


async def _ends_by_running_out_of_attempts(q: Queue, db_url: str, lease: Lease) -> None:
    expire(db_url, lease.file_id)
    assert await q.claim(1) == []
    assert card(db_url, lease.file_id)["status"] == "rejected"


async def _ends_by_revoke(q: Queue, db_url: str, lease: Lease) -> None:
    assert await q.revoke(lease.file_id, lease.owner)


async def _ends_by_losing_the_card(q: Queue, db_url: str, lease: Lease) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["drop_cards"], {"ids": [lease.file_id]})


@pytest.mark.parametrize("end", [
    _ends_by_failing, _ends_by_failing_for_now, _ends_by_deferral, _ends_by_counted_deferral,
    _ends_by_hand_back, _ends_by_rescue, _ends_by_running_out_of_attempts, _ends_by_revoke,
    _ends_by_losing_the_card], ids=lambda end: end.__name__.removeprefix("_ends_by_"))
async def test_a_lease_that_ends_unpublished_leaves_both_its_keys_to_the_sweeper(
        pool: Any, db_url: str,
        end: Callable[[Queue, str, Lease], Awaitable[None]]) -> None:
    """However an attempt's lease ends without publishing, by any statement or by a crash
    that a rescue ends, both keys it may have written (layout.ATTEMPT_KEYS) are the
    sweeper's, exactly once, and no other attempt's are."""
    q = make_queue(pool, max_attempts=1 if end is _ends_by_running_out_of_attempts else 3)
    await new_queued(q, 2)
    lease, other = await q.claim(2)
    await end(q, db_url, lease)
    assert sorted(orphans(db_url)) == both_keys(lease)
    assert sorted(orphans(db_url)) == both_keys(lease)  # a second pass adds nothing
    await q.complete(other, derived_for(other))
    assert sorted(orphans(db_url)) == both_keys(lease)


async def test_preview_and_thumb_are_published_by_one_fenced_commit(
    pool: Any, db_url: str
) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [a] = await q.claim(1)
    expire(db_url, fid)
    [b] = await q.claim(1)
    await q.complete(b, derived_with_thumb(b))
    row = card(db_url, fid)
    assert row["status"] == "ready"
    assert (row["derived_key"], row["thumb_key"]) == (derived_key(b), thumb_key(b))
    assert (row["thumb_version"], row["thumb_width"], row["thumb_height"]) == ("tv", 4, 3)
    assert (row["thumb_bytes"], row["thumbhash"]) == (45, "1XgDfZQL9gh8")
    # The stale attempt publishes neither object; both are left to the sweeper.
    with pytest.raises(LeaseLost):
        await q.complete(a, derived_with_thumb(a))
    assert card(db_url, fid)["thumb_key"] == thumb_key(b)
    with psycopg.connect(db_url) as conn:
        orphans = conn.execute(SQL["orphans_by_key"]).fetchall()
    assert orphans == sorted([(derived_key(a), "lease_lost"), (thumb_key(a), "lease_lost")])


# --- statements whose answer was lost: each repeat is recognized as its own success -------


async def test_repeated_batch_commit_publishes_once_and_orphans_nothing(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q, 4)
    leases = await q.claim(4)
    results = [(lease, derived_for(lease)) for lease in leases]
    assert await q.complete_many(results) == set()
    assert await q.complete_many(results) == set()  # the whole batch again
    assert orphans(db_url) == []
    for lease in leases:
        assert events(db_url, lease.file_id) == ["claimed", "ready"]
    assert (await read_stats(q.db)).to_json()["lease_lost_total"] == 0


@pytest.mark.parametrize("code, expected", [
    (ErrorCode.STORAGE_UNAVAILABLE, "queued"), (ErrorCode.INVALID_IMAGE, "rejected")])
async def test_repeated_failure_answers_what_it_did(pool: Any, db_url: str, code: ErrorCode,
                                                    expected: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.fail(lease, code) == expected
    assert await q.fail(lease, code) == expected
    assert "lease_lost" not in events(db_url, fid)
    assert card(db_url, fid)["attempts"] == 1


async def test_repeated_hand_back_counts_as_handed_back(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.release([lease]) == {fid}
    assert await q.release([lease]) == {fid}
    assert events(db_url, fid) == ["claimed", "released"]


async def test_heartbeat_racing_the_completion_is_not_a_lost_lease(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q)
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    assert await q.heartbeat([lease]) == set()
    await new_queued(q)
    [failed] = await q.claim(1)
    await q.fail(failed, ErrorCode.INVALID_IMAGE)
    assert await q.heartbeat([failed]) == set()
    assert (await read_stats(q.db)).to_json()["lease_lost_total"] == 0


async def test_a_claim_whose_answer_was_lost_is_adopted_with_one_attempt(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    ids = await new_queued(q, 3)
    claim_id = uuid.uuid4()
    # The claim statement commits; its answer never reaches the worker.
    async with pool.connection() as conn:
        await conn.execute(QUERIES["claim"], claim_params(
            n=2, max_attempts=3, claim=claim_id, lease_seconds=30.0, worker="test",
            bulk_share=0.1))
    adopted = await q.adopt_claim(claim_id)
    assert len(adopted) == 2 and {lease.attempt for lease in adopted} == {1}
    assert await q.adopt_claim(uuid.uuid4()) == []
    assert await make_queue(pool, worker="other").adopt_claim(claim_id) == []
    for lease in adopted:
        await q.complete(lease, derived_for(lease))
    [rest] = await q.claim(5)
    assert {lease.file_id for lease in adopted} | {rest.file_id} == set(ids)


async def test_an_adopted_claim_taken_over_since_is_not_adopted(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    claim_id = uuid.uuid4()
    async with pool.connection() as conn:
        await conn.execute(QUERIES["claim"], claim_params(
            n=1, max_attempts=3, claim=claim_id, lease_seconds=30.0, worker="test",
            bulk_share=0.1))
    expire(db_url, fid)
    [b] = await q.claim(1)
    assert b.attempt == 2
    assert await q.adopt_claim(claim_id) == []


async def test_defer_gives_the_attempt_back_and_is_recognized_when_repeated(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    for _ in range(5):  # an outage longer than max_attempts claims spends nothing
        [lease] = await q.claim(1)
        assert lease.attempt == 1
        await q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0)
        await q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0)
    row = card(db_url, fid)
    assert row["status"] == "queued" and row["attempts"] == 0
    assert events(db_url, fid) == ["claimed", "deferred"] * 5
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    with pytest.raises(LeaseLost):
        await q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0)


async def _racing_the_original(db_url: str, lease: Any, repeat: Any) -> Any:
    """Run `repeat` while the original commit of `lease` is still open in another session
    (its sender already saw an error), then let the original commit."""
    original = await psycopg.AsyncConnection.connect(db_url)
    try:
        d = derived_for(lease)
        await original.execute(QUERIES["complete"], {
            "ids": [lease.file_id], "tokens": [lease.token], "keys": [d.key],
            "versions": [d.version], "sha256s": [d.sha256], "widths": [d.width],
            "heights": [d.height], "sizes": [d.size], "thumb_keys": [None],
            "thumb_versions": [None], "thumb_sha256s": [None], "thumb_widths": [None],
            "thumb_heights": [None], "thumb_sizes": [None], "thumbhashes": [None],
            "worker": "test", "fingerprint": None})
        task = asyncio.ensure_future(repeat())
        with psycopg.connect(db_url, autocommit=True) as waiting:
            # The repeat is blocked on the original's row lock: wait for that, not a clock.
            def blocked() -> bool:
                row = waiting.execute(SQL["lock_waiters"]).fetchone()
                return bool(row and row[0] > 0)

            await asyncio.to_thread(wait_for, blocked, interval=0.005,
                                    what="the repeat to wait for the original")
        await original.commit()
        return await task
    finally:
        await original.close()


async def test_a_repeat_racing_its_still_open_original_is_recognized(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    await _racing_the_original(db_url, lease, lambda: q.complete(lease, derived_for(lease)))
    assert events(db_url, fid) == ["claimed", "ready"]
    assert orphans(db_url) == []


async def test_a_heartbeat_racing_an_open_completion_loses_nothing(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    lost = await _racing_the_original(db_url, lease, lambda: q.heartbeat([lease]))
    assert lost == set()
    assert events(db_url, fid) == ["claimed", "ready"]


async def test_counted_deferrals_give_the_attempt_back_until_the_bound_rejects(
        pool: Any, db_url: str) -> None:
    """A file the store fails while it serves others: each deferral gives its attempt
    back and is counted on the card; the max_deferrals-th rejects it storage_unavailable.
    A repeat of a counted deferral answers what it did and counts nothing more."""
    q = make_queue(pool, max_deferrals=4)
    [fid] = await new_queued(q)
    code = ErrorCode.STORAGE_UNAVAILABLE
    for n in (1, 2, 3):
        [lease] = await q.claim(1)
        assert lease.attempt == 1
        assert await q.defer_counted(lease, code) == (Status.QUEUED, n)
        assert await q.defer_counted(lease, code) == (Status.QUEUED, n)
        # An uncounted deferral (the store down) between tries counts nothing.
        [lease] = await q.claim(1)
        await q.defer(lease, code, 0.0)
    [lease] = await q.claim(1)
    assert await q.defer_counted(lease, code) == (Status.REJECTED, 4)
    assert await q.defer_counted(lease, code) == (Status.REJECTED, 4)
    row = card(db_url, fid)
    assert (row["status"], row["error_code"], row["attempts"], row["deferrals"]) == (
        "rejected", "storage_unavailable", 1, 4)
    assert row["finished_at"] is not None
    assert events(db_url, fid) == (["claimed", "deferred_counted", "claimed", "deferred"] * 3
                                   + ["claimed", "exhausted"])
    with pytest.raises(LeaseLost):  # an attempt that does not hold the lease
        await q.defer_counted(dataclasses.replace(lease, token=uuid.uuid4()), code)
    assert events(db_url, fid)[-1] == "lease_lost"
    assert card(db_url, fid)["deferrals"] == 4
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(SQL["set_deferrals"], {"id": fid, "deferrals": -1})



@pytest.mark.parametrize("breaking", [
    "break_status", "break_priority", "break_original_sha256", "break_attempts",
    "break_size_bytes", "break_lease_while_queued", "break_ready_without_derivative",
    "break_rejected_without_code", "break_event_kind"])
async def test_the_cards_rules_are_the_databases_whoever_writes(
        pool: Any, db_url: str, breaking: str) -> None:
    """Each rule the protocol stands on (migration 0023: the columns' types and the card's
    states) refuses a write that breaks it, whatever sends it."""
    [fid] = await new_queued(make_queue(pool))
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(SQL[breaking], {"id": fid})
    assert card(db_url, fid)["status"] == "queued"

async def test_a_counted_deferral_waits_a_growing_backoff(pool: Any, db_url: str) -> None:
    q = make_queue(pool, retry_base_seconds=100.0, retry_cap_seconds=1000.0,
                   rng=random.Random(1))
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    assert await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE) == (Status.QUEUED, 1)
    assert await q.claim(1) == []  # not due before its backoff
    with psycopg.connect(db_url) as conn:
        row = conn.execute(SQL["backoff_seconds"], {"id": fid}).fetchone()
    assert row is not None and 0 < float(row[0]) <= 100.0


async def rederive_claimed(pool: Any) -> tuple[Queue, Lease, Lease]:
    """A photo published under fingerprint "old", queued again under "new" and claimed:
    the queue of "new", the first attempt's lease and the re-derive's."""
    old = make_queue(pool, fingerprint="old")
    [fid] = await new_queued(old)
    [first] = await old.claim(1)
    await old.complete(first, derived_for(first))
    q = make_queue(pool, fingerprint="new")
    assert await q.rederive("alice", "new") == 1
    [lease] = await q.claim(1)
    assert lease.file_id == fid
    return q, first, lease


async def test_one_batch_of_a_first_derivation_a_rederive_and_a_lost_lease(
        pool: Any, db_url: str) -> None:
    """The common case and the rows it leaves to the whole commit, in one batch: each
    row ends as if it had been committed alone."""
    old = make_queue(pool, fingerprint="old")
    [redone, fresh, stolen] = await new_queued(old, 3)
    [first] = await old.claim(1)
    assert first.file_id == redone
    await old.complete(first, derived_for(first))
    q = make_queue(pool, fingerprint="new")
    assert await q.rederive("alice", "new") == 1
    leases = {lease.file_id: lease for lease in await q.claim(3)}
    assert set(leases) == {redone, fresh, stolen}
    expire(db_url, stolen)
    [rescued] = await make_queue(pool, worker="other").claim(1)
    results = [(lease, derived_for(lease)) for lease in leases.values()]
    assert await q.complete_many(results) == {leases[stolen].token}
    assert card(db_url, fresh)["derived_key"] == derived_key(leases[fresh])
    assert card(db_url, redone)["derived_key"] == derived_key(leases[redone])
    assert card(db_url, stolen)["lease_token"] == rescued.token
    assert sorted(orphans(db_url)) == sorted([(derived_key(first), leases[redone].token),
                                              *both_keys(leases[stolen])])
    assert events(db_url, stolen)[-1] == "lease_lost"


async def test_a_commit_with_its_claim_does_not_rescue_a_lease_it_commits(
        pool: Any, db_url: str) -> None:
    """A re-derive whose lease ran out but still holds (no one took it over) is left by
    the common case to the whole commit; the claim sent in the same transaction rescues
    expired leases first, and must not take this one from under its own commit."""
    q, first, lease = await rederive_claimed(pool)
    fid = lease.file_id
    expire(db_url, fid)
    lost, leases = await q.complete_and_claim([(lease, derived_for(lease))], 1)
    assert (lost, leases) == (set(), [])
    assert card(db_url, fid)["derived_key"] == derived_key(lease)
    assert events(db_url, fid) == ["claimed", "ready", "rederive", "claimed", "ready"]
    assert orphans(db_url) == [(derived_key(first), lease.token)]
