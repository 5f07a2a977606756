"""Writes whose outcome is unknown, made so at the socket: the connection to a real
PostgreSQL is cut by a `FaultProxy` at one statement, either before it reaches the server
(not committed) or after the server answered it (committed, the answer lost). The caller
then does what the product does after a lost connection: it sends the same write again
(a worker, the console), or runs the pass again (the sweeper, `darkroom reconcile`).
Either way it must end as if the connection had held: no double effect, nothing lost,
each event written once.
"""

from __future__ import annotations

import asyncio
import functools
import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from darkroom import pauses, retry
from darkroom.card import Priority
from darkroom.config import Settings
from darkroom.db.connection import open_pool
from darkroom.db.database import CONNECTION_ERRORS
from darkroom.errors import ErrorCode
from darkroom.layout import original_key
from darkroom.queue import ClaimUnknown, Queue, Status, derived_key, thumb_key
from darkroom.reads import Reads
from darkroom.storage import ObjectStore, open_store
from darkroom.sweeper import Orphans, PendingExpiry, Reconcile
from tests.queue.test_protocol import (
    derived_for,
    expire,
    new_queued,
    orphans,
    rederive_claimed,
)
from tests.support.faults import FaultProxy, through_proxy
from tests.support.services import make_queue
from tests.support.sql import SQL

WHERE = ["before", "after"]
# The fenced commit's common case (`publish`), by a fragment only its text holds.
PUBLISH = b"f.thumb_key IS NULL RETURNING"


@dataclass
class Lossy:
    """A queue whose connections pass through a proxy that can cut one statement."""

    proxy: FaultProxy
    url: str
    queue: Queue

    async def lost(self, fragment: bytes, where: str,
                   write: Callable[[], Awaitable[Any]]) -> None:
        """Run `write` with the statement holding `fragment` cut `where`: it fails as a
        lost connection does."""
        self.proxy.cut_statement(fragment, where=where)
        with pytest.raises(CONNECTION_ERRORS):
            await write()
        assert not self.proxy.statement_cut_pending, "the write never sent its statement"


@pytest.fixture
async def lossy(db_url: str) -> AsyncIterator[Lossy]:
    proxy, url = through_proxy(db_url)
    pool = await open_pool(url, min_size=1, max_size=2)
    try:
        yield Lossy(proxy, url, make_queue(pool, max_deferrals=2))
    finally:
        await pool.close()
        proxy.close()


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "objects").as_uri())


def events(db_url: str, file_id: uuid.UUID) -> list[str]:
    with psycopg.connect(db_url) as conn:
        return [k for (k,) in conn.execute(SQL["event_kinds"], {"id": file_id})]


def card(db_url: str, file_id: uuid.UUID) -> tuple[Any, ...] | None:
    with psycopg.connect(db_url) as conn:
        return conn.execute(SQL["lost_answer_card"], {"id": file_id}).fetchone()


# --- an upload's confirm ------------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("first", [True, False], ids=["first card", "next card"])
async def test_a_confirm_whose_answer_was_lost_stamps_once(
        pool: Any, db_url: str, lossy: Lossy, where: str, first: bool) -> None:
    """The confirm moves its owner's clock in its own statement (or, for the owner's first
    card, through darkroom_fair_stamps): cut, then sent again, the card is queued once and
    the owner's clock moved once, the card's stamp being the clock's."""
    q = make_queue(pool)
    if not first:
        await new_queued(q)  # alice's clock exists
    made = await q.create_file(owner="alice", filename="a.jpg", content_type="image/jpeg",
                               size=1)
    clock = {"owner": "alice", "priority": "interactive"}
    with psycopg.connect(db_url) as conn:
        [(expected,)] = conn.execute(SQL["stamp_by_the_function"], clock).fetchall()
        conn.rollback()  # the clock as it was
    confirm = functools.partial(lossy.queue.confirm_card, made.id, "alice", "v1")
    await lossy.lost(b"bumped AS (", where, confirm)
    again = await confirm()
    assert again.outcome.name == ("ALREADY" if where == "after" else "QUEUED")
    with psycopg.connect(db_url) as conn:
        [(stamp, _)] = conn.execute(SQL["fair_places_among"], {"ids": [made.id]}).fetchall()
        [(now,)] = conn.execute(SQL["owner_clock"], clock).fetchall()
    assert stamp == expected == now


# --- a worker's claim and its publication ----------------------------------------------


@pytest.mark.parametrize("where", WHERE)
async def test_a_claim_whose_answer_was_lost_is_adopted_and_accounted_for_when_it_ends(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    """The worker looks up a claim whose answer never came by its id (adopt_claim). What
    the claim leased is a lease like any other: nothing for the sweeper while it holds,
    both its keys once it ends unpublished. What it never leased, nothing is."""
    q = make_queue(pool)
    await new_queued(q)
    lossy.proxy.cut_statement(b"headed AS (", where=where)
    with pytest.raises(ClaimUnknown) as unknown:
        await lossy.queue.claim(1)
    assert not lossy.proxy.statement_cut_pending
    adopted = await q.adopt_claim(unknown.value.claim_id)
    if where == "before":
        assert adopted == []
        adopted = await q.claim(1)
    [lease] = adopted
    assert orphans(db_url) == []
    assert await q.release([lease]) == {lease.file_id}
    assert sorted(orphans(db_url)) == sorted([(derived_key(lease), lease.token),
                                              (thumb_key(lease), lease.token)])
    assert events(db_url, lease.file_id) == ["claimed", "released"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_publication_whose_answer_was_lost_leaves_nothing_for_the_sweeper(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    """The worker's completer sends a commit again until it is answered: the repeat of one
    that went through is recognized as published, and neither leaves anything for the
    sweeper (the thumb's key, for a photo that needed none, included)."""
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    publish = functools.partial(lossy.queue.complete_many, [(lease, derived_for(lease))])
    await lossy.lost(PUBLISH, where, publish)
    assert await publish() == set()
    assert await publish() == set()
    assert orphans(db_url) == []
    assert events(db_url, fid) == ["claimed", "ready"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_rederive_whose_publication_answer_was_lost_supersedes_its_derivative_once(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    """A re-derive is published by the whole commit (`complete`), not the common case's:
    the derivative it replaces goes to the sweeper once, however often the commit is
    sent, and the new one never."""
    _, first, lease = await rederive_claimed(pool)
    fid = lease.file_id
    publish = functools.partial(lossy.queue.complete_many, [(lease, derived_for(lease))])
    await lossy.lost(b"superseded AS (", where, publish)
    assert await publish() == set()
    assert await publish() == set()
    assert sorted(orphans(db_url)) == [(derived_key(first), lease.token)]
    assert events(db_url, fid) == ["claimed", "ready", "rederive", "claimed", "ready"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_commit_with_its_claim_whose_rows_left_did_not_answer_adopts_the_claim(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    """The common case and the claim committed together; the rows they left (here a lost
    lease) go through `complete` alone, and that answer is lost: the caller is told the
    claim's outcome is unknown, finds its lease by the claim's id, and sends the commits
    again: the lost lease is answered lost, and the card stays its rescuer's."""
    q = make_queue(pool)
    [good, stolen, _] = await new_queued(q, 3)
    leases = {lease.file_id: lease for lease in await q.claim(2)}
    expire(db_url, stolen)
    [rescued] = await make_queue(pool, worker="other").claim(1)
    assert rescued.file_id == stolen
    results = [(leases[good], derived_for(leases[good])),
               (leases[stolen], derived_for(leases[stolen]))]
    lossy.proxy.cut_statement(b"superseded AS (", where=where)
    with pytest.raises(ClaimUnknown) as unknown:
        await lossy.queue.complete_and_claim(results, 1)
    assert not lossy.proxy.statement_cut_pending
    assert len(await q.adopt_claim(unknown.value.claim_id)) == 1
    row = card(db_url, good)
    assert row is not None and row[0] == "ready"
    assert await q.complete_many(results) == {leases[stolen].token}
    assert events(db_url, good) == ["claimed", "ready"]
    assert events(db_url, stolen)[:2] == ["claimed", "claimed"]
    assert set(events(db_url, stolen)[2:]) == {"lease_lost"}
    # The rescuer's lease is untouched, and publishes.
    assert await q.complete_many([(rescued, derived_for(rescued))]) == set()


@pytest.mark.parametrize("where", WHERE)
async def test_a_commit_with_its_claim_whose_answer_was_lost_is_all_or_nothing(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    """The worker's commit with the claim of the room it leaves, one pipeline with no
    transaction block of its own, cut before or after: neither committed, or both did.
    The commit sent again is recognized; the claim is found by its id, or was never
    made."""
    q = make_queue(pool)
    [fid, _] = await new_queued(q, 2)
    [lease] = await q.claim(1)
    results = [(lease, derived_for(lease))]
    lossy.proxy.cut_statement(b"headed AS (", where=where)
    with pytest.raises(ClaimUnknown) as unknown:
        await lossy.queue.complete_and_claim(results, 1)
    assert not lossy.proxy.statement_cut_pending
    adopted = await q.adopt_claim(unknown.value.claim_id)
    row = card(db_url, fid)
    assert row is not None and (row[0] == "ready") is (where == "after")
    assert len(adopted) == (1 if where == "after" else 0)
    assert await q.complete_many(results) == set()
    assert events(db_url, fid) == ["claimed", "ready"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_hand_back_of_an_unstarted_lease_sent_again_gives_its_attempt_back_once(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    hand_back = functools.partial(lossy.queue.release, [lease], [lease.token])
    await lossy.lost(b"released AS (", where, hand_back)
    assert await hand_back() == {fid}
    assert await hand_back() == {fid}
    row = card(db_url, fid)
    assert row is not None and row[:2] == ("queued", 0)
    assert events(db_url, fid) == ["claimed", "released"]


@pytest.mark.parametrize("where", WHERE)
async def test_unpublished_attempts_moved_by_a_pass_whose_answer_was_lost_are_swept_once(
        pool: Any, db_url: str, lossy: Lossy, store: ObjectStore, where: str) -> None:
    """The orphan pass that fills in the keys of the attempts that ended unpublished, cut
    before or after: the next pass deletes both of the attempt's objects either way."""
    q = make_queue(pool)
    await new_queued(q)
    [lease] = await q.claim(1)
    await asyncio.to_thread(store.put, derived_key(lease), b"webp")
    await q.release([lease])
    cut = Orphans(lossy.queue.db, store, guard_seconds=0)
    await lossy.lost(b"DELETE FROM unpublished_attempts", where, cut.run_once)
    assert await Orphans(q.db, store, guard_seconds=0).run_once() == 2
    assert list(store.list(derived_key(lease))) == []
    assert orphans(db_url) == []


# --- a worker's counted deferral -------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("requeue", ["fail", "defer"])
async def test_a_requeue_sent_again_queues_and_stamps_once(
        pool: Any, db_url: str, lossy: Lossy, where: str, requeue: str) -> None:
    """A transient failure or a deferral cut before or after, then sent again (as the
    worker does until it is answered): the card queued once, its event written once, and
    its owner's clock moved once, the card's stamp being the clock's."""
    q = make_queue(pool)
    [fid] = await new_queued(q)
    [lease] = await q.claim(1)
    send: Callable[[], Awaitable[object]]
    if requeue == "fail":
        send = functools.partial(lossy.queue.fail, lease, ErrorCode.STORAGE_UNAVAILABLE)
        fragment, kind = b"'retry_scheduled'", "retry_scheduled"
    else:
        send = functools.partial(lossy.queue.defer, lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0)
        fragment, kind = b"'deferred', attempts", "deferred"
    await lossy.lost(fragment, where, send)
    await send()
    await send()
    clock = {"owner": "alice", "priority": "interactive"}
    with psycopg.connect(db_url) as conn:
        [(stamp, _)] = conn.execute(SQL["fair_places_among"], {"ids": [fid]}).fetchall()
        [(now,)] = conn.execute(SQL["owner_clock"], clock).fetchall()
    row = card(db_url, fid)
    assert row is not None and row[0] == "queued"
    assert events(db_url, fid) == ["claimed", kind]
    assert stamp == now == 1.0  # the first card's 0, then one move


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("last", [False, True], ids=["counted", "at-the-bound"])
async def test_a_counted_deferral_sent_again_counts_once(
        pool: Any, db_url: str, lossy: Lossy, where: str, last: bool) -> None:
    """The worker sends a counted deferral again until it is answered (Worker._db). At
    the bound (DARKROOM_MAX_DEFERRALS, 2 here) the deferral rejects the card: the repeat
    answers that, rather than a lost lease or a second count."""
    q = make_queue(pool, max_deferrals=2)
    [fid] = await new_queued(q)
    if last:
        [lease] = await q.claim(1)
        assert await q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE) == (Status.QUEUED, 1)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(SQL["make_due"])
    [lease] = await q.claim(1)
    before = card(db_url, fid)
    defer = functools.partial(lossy.queue.defer_counted, lease, ErrorCode.STORAGE_UNAVAILABLE)
    await lossy.lost(b"deferred_counted", where, defer)
    assert (card(db_url, fid) == before) is (where == "before")

    n = 2 if last else 1
    assert await defer() == ((Status.REJECTED if last else Status.QUEUED), n)
    assert await defer() == ((Status.REJECTED if last else Status.QUEUED), n)
    assert card(db_url, fid) == (("rejected", 1, 2, "v1", "storage_unavailable") if last
                                 else ("queued", 0, 1, "v1", None))
    assert events(db_url, fid) == ["claimed", "deferred_counted"] + (
        ["claimed", "exhausted"] if last else [])


# --- the pending sweep's confirm of a stored upload -------------------------------------


@pytest.mark.parametrize("where", WHERE)
async def test_a_stored_upload_found_by_the_sweep_is_confirmed_once(
        pool: Any, db_url: str, lossy: Lossy, store: ObjectStore, where: str) -> None:
    """An expired pending card whose upload is stored: the sweep's confirm is cut. Sent
    again for the same card (as a caller holding it would), then the next pass: the card
    is queued once, for the stored version, with one `upload_found`, and never expired."""
    q = make_queue(pool)
    made = await q.create_file(owner="o", filename="a.jpg", content_type="image/jpeg", size=3)
    version = await asyncio.to_thread(store.put, made.original_key, b"abc")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["age_every_card"])
    sweep = PendingExpiry(lossy.queue, store, 86_400)
    [due] = await Reads(lossy.queue.db).pending_due(ttl_seconds=86_400, limit=10)
    await lossy.lost(b"'upload_found'", where, sweep.run_once)
    assert card(db_url, made.id)[0] == ("queued" if where == "after" else "pending")  # type: ignore[index]

    found = functools.partial(lossy.queue.confirm_found_upload, due, ttl_seconds=86_400,
                              version=version, sha256=None)
    assert await found() is (where == "before")
    assert await found() is False
    assert await sweep.run_once() == 0
    assert card(db_url, made.id) == ("queued", 0, 0, version, None)
    assert events(db_url, made.id) == ["upload_found"]
    [lease] = await q.claim(1)
    assert (lease.file_id, lease.original_version) == (made.id, version)


# --- darkroom reconcile --restore ----------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("statement", [b"INSERT INTO archive_files", b"stamped AS (",
                                       b"'restored'", b"COMMIT"],
                         ids=["create", "confirm", "event", "commit"])
async def test_a_restore_run_again_makes_one_card_with_its_history(
        pool: Any, db_url: str, lossy: Lossy, store: ObjectStore, statement: bytes,
        where: str) -> None:
    """`darkroom reconcile --restore` cut at any statement of a restore, then run again
    (as an operator does after a failed command): one card for the stored original, queued
    for its newest version, its history saying `restored` once."""
    q = make_queue(pool)
    file_id = uuid.uuid4()
    key = original_key(file_id, "bob")
    version = await asyncio.to_thread(store.put, key, b"abcd")  # no card holds it
    unit = Reconcile(lossy.queue.db, store, guard_seconds=0, queue=lossy.queue)
    await lossy.lost(statement, where, functools.partial(unit.run, dry_run=False, restore=True))

    again = await unit.run(dry_run=False, restore=True)
    assert again.deleted == 0
    assert card(db_url, file_id) == ("queued", 0, 0, version, None)
    assert events(db_url, file_id) == ["restored"]
    assert (await unit.run(dry_run=False, restore=True)).restored == {}
    [lease] = await q.claim(1)
    assert (lease.file_id, lease.original_version, lease.owner) == (file_id, version, "bob")


# --- an operator's pause and resume ---------------------------------------------------------


def pause_log(db_url: str) -> list[tuple[str, str | None, str]]:
    with psycopg.connect(db_url) as conn:
        return list(conn.execute(SQL["claim_pause_log"]).fetchall())


@pytest.mark.parametrize("where", WHERE)
async def test_a_pause_sent_again_pauses_once(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    q = make_queue(pool)
    [alice] = await new_queued(q, owner="alice")
    [bob] = await new_queued(q, owner="bob")
    pause = functools.partial(pauses.pause_claims, lossy.queue.db, actor="cli:ops",
                              owner="alice")
    await lossy.lost(b"INSERT INTO claim_pauses", where, pause)

    held, made = await pause()
    assert (held.owner, held.priority, held.paused_by) == ("alice", None, "cli:ops")
    assert made is (where == "before")  # after: the pause in force is the lost one
    assert [p.owner for p in await pauses.claim_pauses(q.db)] == ["alice"]
    assert pause_log(db_url) == [("paused", "alice", "cli:ops")]
    assert [lease.file_id for lease in await q.claim(5)] == [bob]
    assert alice not in {lease.file_id for lease in await q.claim(5)}


@pytest.mark.parametrize("where", WHERE)
async def test_a_resume_sent_again_resumes_once(
        pool: Any, db_url: str, lossy: Lossy, where: str) -> None:
    q = make_queue(pool)
    [alice] = await new_queued(q, owner="alice")
    await pauses.pause_claims(q.db, actor="cli:ops", owner="alice",
                              priority=Priority.INTERACTIVE)
    assert await q.claim(5) == []
    resume = functools.partial(pauses.resume_claims, lossy.queue.db, actor="api:root",
                               owner="alice", priority=Priority.INTERACTIVE)
    await lossy.lost(b"DELETE FROM claim_pauses", where, resume)

    lifted = await resume()
    # After: the lost resume lifted it, so the repeat lifts nothing.
    assert [p.owner for p in lifted] == ([] if where == "after" else ["alice"])
    assert await resume() == []
    assert await pauses.claim_pauses(q.db) == []
    assert pause_log(db_url) == [("paused", "alice", "cli:ops"),
                                 ("resumed", "alice", "api:root")]
    assert [lease.file_id for lease in await q.claim(5)] == [alice]


# --- darkroom retry ------------------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
async def test_a_retry_run_sends_its_statement_again_and_queues_each_card_once(
        pool: Any, db_url: str, lossy: Lossy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """`darkroom retry` cut at its statement: the run sends it again with the same run id
    (retry._fenced), and ends with every card queued once, one `retried` event each."""
    q = make_queue(pool, max_attempts=1)
    ids = await new_queued(q, 2, owner="alice")
    for lease in await q.claim(2):
        assert await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE) == "rejected"
    monkeypatch.setenv("DARKROOM_DATABASE_URL", lossy.url)
    lossy.proxy.cut_statement(b"retried_by IS DISTINCT FROM", where=where)
    out = io.StringIO()
    assert await retry.run(Settings(data_dir=tmp_path), owner=None, codes=None,
                           everyone=False, since=None, dry_run=False, wait=False,
                           out=out) == 0
    assert not lossy.proxy.statement_cut_pending
    for fid in ids:
        assert card(db_url, fid) == ("queued", 0, 0, "v1", None)
        assert events(db_url, fid) == ["claimed", "exhausted", "retried"]
    # Its report counts every card the run queued, those of a statement whose answer was
    # lost included (read back by the run's id), so --wait waits for them too.
    assert f"queued {len(ids)} retry(s)" in out.getvalue()
    assert {lease.file_id for lease in await q.claim(5)} == set(ids)


# The proxy's own probes: statements on no table of darkroom's.
FIRST = "SELECT 1 AS first"
SECOND = "SELECT 2 AS second"
MADE = "CREATE TABLE made_before_the_cut AS SELECT now()"
COUNT_MADE = "SELECT count(*) FROM made_before_the_cut"


async def test_the_proxy_cuts_only_the_statement_named(db_url: str) -> None:
    """The cut is made at the named statement's execution, once: a statement prepared on
    the connection before is still known by its name."""
    proxy, url = through_proxy(db_url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(3):
                conn.execute(FIRST, prepare=True)
            proxy.cut_statement(b"AS first", where="before")
            conn.execute(SECOND, prepare=True)
            assert proxy.statement_cut_pending
            with pytest.raises(psycopg.OperationalError):
                conn.execute(FIRST, prepare=True)
        assert not proxy.statement_cut_pending
        assert (proxy.counters.cut_before, proxy.counters.cut_after) == (1, 0)
        with psycopg.connect(url, autocommit=True) as conn:
            proxy.cut_statement(b"now()", where="after")
            with pytest.raises(psycopg.OperationalError):
                conn.execute(MADE)
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert conn.execute(COUNT_MADE).fetchone() == (1,)
        assert proxy.counters.cut_after == 1
    finally:
        proxy.close()


@pytest.mark.parametrize("requeue", ["release", "fail", "defer", "defer_counted"])
async def test_a_requeue_repeated_after_another_attempt_settled_the_card_answers_the_same(
        pool: Any, db_url: str, requeue: str) -> None:
    """A re-queue goes through, its answer lost; before its repeat arrives, another worker
    claims the card and hands it back. The repeat still answers what the first did, and
    records no lost lease (found by attack: the card keeps only the last attempt's token,
    so the repeat took itself for a lost lease)."""
    first = make_queue(pool, worker="w1")
    [file_id] = await new_queued(first)
    [lease] = await first.claim(1)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "release": lambda: first.release([lease]),
        "fail": lambda: first.fail(lease, ErrorCode.STORAGE_UNAVAILABLE),
        "defer": lambda: first.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0),
        "defer_counted": lambda: first.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE)}
    answer = await calls[requeue]()
    second = make_queue(pool, worker="w2")
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(SQL["make_due"], {"id": file_id})
    [taken] = await second.claim(1)
    assert taken.file_id == file_id
    assert await second.release([taken]) == {file_id}
    assert await calls[requeue]() == answer
    with psycopg.connect(db_url, autocommit=True) as c:
        lost = c.execute(SQL["events"], {"id": file_id, "kind": "lease_lost"}).fetchall()
    assert lost == []


async def test_a_failure_repeated_after_an_operators_retry_answers_the_same(
        pool: Any) -> None:
    """A failure rejects the card, its answer lost; an operator's retry re-queues the card
    before the repeat arrives. The repeat answers `rejected`, what the failure did, not
    the card's status now (found by attack: it answered `queued`)."""
    first = make_queue(pool, worker="w1")
    [file_id] = await new_queued(first)
    [lease] = await first.claim(1)
    assert await first.fail(lease, ErrorCode.PROCESSING_FAILED) == Status.REJECTED
    assert await first.retry("alice", run=uuid.uuid4(), actor="operator", codes=None,
                             file_id=file_id) == [file_id]
    assert await first.fail(lease, ErrorCode.PROCESSING_FAILED) == Status.REJECTED
