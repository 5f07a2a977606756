"""Fair share between owners, interactive before bulk, and re-derive, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from darkroom.db.connection import open_pool
from darkroom.db.queries import QUERIES
from darkroom.errors import ErrorCode
from darkroom.layout import original_key
from darkroom.owners import set_owner_weight
from darkroom.queue import (
    Derived,
    Lease,
    LeaseLost,
    Priority,
    Queue,
    claim_params,
    derived_key,
)
from darkroom.reads import Reads
from darkroom.stats import read as read_stats
from tests.support.services import confirm, make_queue, wait_for
from tests.support.sql import SQL


async def add(q: Queue, owner: str, n: int = 1,
              priority: Priority = Priority.INTERACTIVE) -> list[uuid.UUID]:
    ids = []
    for i in range(n):
        card = await q.create_file(owner=owner, filename=f"{owner}{i}.jpg",
                                   content_type="image/jpeg", size=1, priority=priority)
        await confirm(q, card.id, owner, "v1")
        ids.append(card.id)
    return ids


def derived_for(lease: Lease) -> Derived:
    return Derived(key=derived_key(lease), version="dv", sha256="ab" * 32,
                   width=1, height=1, size=1)


async def claim_order(q: Queue) -> list[uuid.UUID]:
    """Claim one at a time, completing each, until nothing is left: the claim order."""
    order = []
    while leases := await q.claim(1):
        order.append(leases[0].file_id)
        await q.complete(leases[0], derived_for(leases[0]))
    return order


def owners_of(db_url: str, ids: list[uuid.UUID]) -> list[str]:
    with psycopg.connect(db_url) as conn:
        rows: dict[uuid.UUID, str] = dict(
            conn.execute(SQL["card_owners"]).fetchall())
    return [rows[i] for i in ids]


async def test_one_owner_is_first_in_first_out(pool: Any) -> None:
    q = make_queue(pool)
    ids = await add(q, "alice", 6)
    assert await claim_order(q) == ids


async def test_a_late_owner_starts_after_about_one_job(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await add(q, "a", 20)
    first = await q.claim(2)  # two slots busy with A's import
    [b] = await add(q, "b")
    order = await claim_order(q)
    assert order.index(b) <= 1, owners_of(db_url, order)[:4]
    for lease in first:
        await q.complete(lease, derived_for(lease))


async def test_owners_alternate_while_both_wait(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await add(q, "a", 10)
    await add(q, "b", 10)
    await add(q, "c", 2)
    owners = owners_of(db_url, await claim_order(q))
    # c's two cards come within the first rounds, and a and b take turns.
    assert owners.index("c") <= 2 and owners[:6].count("c") == 2
    assert all(owners[i] != owners[i + 1] for i in range(0, 14))


async def test_past_work_is_no_debt(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await add(q, "a", 10)
    await claim_order(q)  # a's big import is done
    await add(q, "b", 5)
    [a] = await add(q, "a")
    order = await claim_order(q)
    assert order.index(a) <= 1


async def test_weight_gives_a_larger_share(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await set_owner_weight(q.db, "heavy", 3)
    await add(q, "light", 20)
    await add(q, "heavy", 20)
    owners = owners_of(db_url, await claim_order(q))[:16]
    assert owners.count("heavy") >= 11


async def test_interactive_before_bulk_and_bulk_uses_idle_slots(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    bulk = await add(q, "a", 5, Priority.BULK)
    [first] = await q.claim(1)
    assert first.file_id == bulk[0]  # nothing interactive waits: bulk runs
    [inter] = await add(q, "b")
    [nxt] = await q.claim(1)
    assert nxt.file_id == inter
    # The same owner's interactive upload also passes its own bulk work.
    [mine] = await add(q, "a")
    assert (await q.claim(1))[0].file_id == mine


async def test_concurrent_confirms_of_one_owner_get_distinct_stamps(pool: Any,
                                                                    db_url: str) -> None:
    q = make_queue(pool)
    cards = [await q.create_file(owner="a", filename=f"{i}.jpg", content_type="image/jpeg",
                                 size=1) for i in range(12)]
    await asyncio.gather(*(confirm(q, c.id, "a", "v1") for c in cards))
    with psycopg.connect(db_url) as conn:
        stamps = [r[0] for r in conn.execute(
            SQL["fair_stamps_of_owner"], {"owner": "a"}).fetchall()]
    assert len(set(stamps)) == 12


async def test_a_confirm_stamps_as_the_stamping_function_does(pool: Any, db_url: str) -> None:
    """A confirm stamps its card in its own statement (migration 0022), by the rule of
    darkroom_fair_stamps: the same stamp, for an owner's first card and its next ones,
    with a weight, in either class, behind the head and after it moved past the owner."""
    q = make_queue(pool)
    await set_owner_weight(q.db, "w", 2.5)

    async def check(owner: str, priority: Priority = Priority.INTERACTIVE) -> None:
        card = await q.create_file(owner=owner, filename="f.jpg", content_type="image/jpeg",
                                   size=1, priority=priority)
        with psycopg.connect(db_url) as conn:
            [(expected,)] = conn.execute(SQL["stamp_by_the_function"],
                                         {"owner": owner, "priority": priority}).fetchall()
            conn.rollback()  # the owner's clock as it was
        await confirm(q, card.id, owner, "v1")
        with psycopg.connect(db_url) as conn:
            [(stamp, _)] = conn.execute(SQL["fair_places_among"], {"ids": [card.id]}).fetchall()
        assert stamp == expected, (owner, priority)

    for owner in ("b", "b", "a", "w", "w", "a", "c"):
        await check(owner)
    await check("a", Priority.BULK)
    await check("a", Priority.BULK)
    for _ in range(5):  # the head moves past the owners' clocks
        [lease] = await q.claim(1)
        await q.complete(lease, derived_for(lease))
    for owner in ("a", "c", "w", "z"):
        await check(owner)
    await check("w", Priority.BULK)


@pytest.mark.parametrize("held", ["its card", "its owner's clock",
                                  "its owner's clock, by a writer that rolls back"])
async def test_a_confirm_that_waits_for_a_lock_stamps_by_the_head_it_finds_then(
        pool: Any, db_url: str, held: str) -> None:
    """A confirm that waits for a lock (its card's, or its owner's clock, which another
    confirm of the owner holds, or a writer that then rolls back) stamps by the head and
    the weight as they are once it has it: claims that moved the head meanwhile are not
    passed over (found by attack; the last case by the third: PostgreSQL works a row's
    new values out again after a wait only when the other writer committed a change)."""
    q = make_queue(pool)
    await add(q, "bob", 3)
    await add(q, "alice")
    [lease] = await q.claim(1)  # alice's card: her clock exists, and the head is hers
    await q.complete(lease, derived_for(lease))
    mine = await q.create_file(owner="alice", filename="y.jpg", content_type="image/jpeg",
                               size=1)
    other = await q.create_file(owner="alice", filename="x.jpg", content_type="image/jpeg",
                                size=1)
    clock = {"owner": "alice", "priority": "interactive"}
    with psycopg.connect(db_url) as blocker, psycopg.connect(db_url, autocommit=True) as look:
        if held == "its card":
            blocker.execute(SQL["lock_card"], {"id": mine.id})
        elif "rolls back" in held:
            blocker.execute(SQL["lock_owner_clock"], clock)
        else:
            blocker.execute(QUERIES["confirm"], {"id": other.id, "owner": "alice",
                                                 "version": "v1", "sha256": None,
                                                 "size": None})
        waiting = asyncio.ensure_future(confirm(q, mine.id, "alice", "v1"))

        def blocked() -> bool:
            row = look.execute(SQL["lock_waiters"]).fetchone()
            return bool(row and row[0] > 0)

        await asyncio.to_thread(wait_for, blocked, interval=0.005,
                                what="the confirm to wait for the lock")
        for _ in range(3):  # the head moves on past alice's clock
            [lease] = await q.claim(1)
            await q.complete(lease, derived_for(lease))
        await set_owner_weight(q.db, "alice", 4)
        if held == "its card" or "rolls back" in held:
            [(prev,)] = look.execute(SQL["owner_clock"], clock).fetchall()
            blocker.rollback()
        else:
            blocker.commit()
            [(prev, _)] = look.execute(SQL["fair_places_among"],
                                       {"ids": [other.id]}).fetchall()
        await waiting
        [(stamp, _)] = look.execute(SQL["fair_places_among"], {"ids": [mine.id]}).fetchall()
        [(expected,)] = look.execute(SQL["stamp_after"], {**clock, "prev": prev,
                                                          "weight": 4}).fetchall()
        head = look.execute(SQL["interactive_head"]).fetchone()
    assert stamp == expected
    assert head is not None and (stamp, "alice") > tuple(head)


def test_a_batch_is_spaced_by_the_weight_its_clock_moved_by(db_url: str) -> None:
    """A batch's stamps (a retry or re-derive of several cards: darkroom_fair_stamps with
    n > 1) come from one read of the owner's weight, made once the clock row is locked: a
    weight changed meanwhile cannot start the batch at or before the owner's earlier cards
    (found by attack: the weight was read twice)."""
    owner = {"owner": "alice", "priority": "bulk"}
    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute(SQL["set_owner_clock"], {**owner, "stamp": 10.0})
        setup.execute(SQL["hold_clock_function"])
        setup.execute(SQL["hold_clock_trigger"])
        setup.execute(SQL["take_clock_hold"])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            def batch() -> list[float]:
                with psycopg.connect(db_url, autocommit=True) as conn:
                    [(stamps,)] = conn.execute(SQL["stamps_by_the_function"],
                                               {**owner, "n": 3}).fetchall()
                    return list(stamps)

            stamping = pool.submit(batch)

            def held() -> bool:
                row = setup.execute(SQL["advisory_lock_waiters"]).fetchone()
                return bool(row and row[0] > 0)

            wait_for(held, interval=0.005, what="the batch to reach the clock's update")
            setup.execute(QUERIES["set_owner_weight"], {"owner": "alice", "weight": 0.25})
            setup.execute(SQL["release_clock_hold"])
            stamps = stamping.result(timeout=60)
        [(clock,)] = setup.execute(SQL["owner_clock"], owner).fetchall()
    assert stamps[-1] == clock
    assert stamps == sorted(stamps) and stamps[0] > 10.0
    assert len({b - a for a, b in itertools.pairwise(stamps)}) == 1


async def test_two_workers_handing_back_cards_of_the_same_owners_do_not_deadlock(
        pool: Any, db_url: str) -> None:
    """Two workers hand back (release) cards of alice and bob, listed in opposite orders,
    while a reader holds one of them: each hand-back locks its cards before it stamps
    them, and takes the owners' clocks in one order, so neither waits for the other in a
    circle (found by attack: each took an owner's clock before its card's lock, in row
    order, and one of them died of a deadlock)."""
    q = make_queue(pool)
    names = {"1": "alice", "2": "bob", "3": "bob", "4": "alice"}
    for digit, owner in names.items():
        made = await q.create_file(owner=owner, filename="f.jpg", content_type="image/jpeg",
                                   size=1, file_id=uuid.UUID(digit * 32))
        await confirm(q, made.id, owner, "v1")
    leases = {lease.file_id.hex[0]: lease for lease in await q.claim(4)}
    first = [leases["1"], leases["2"]]  # alice's, bob's
    second = [leases["3"], leases["4"]]  # bob's, alice's
    with psycopg.connect(db_url) as reader, psycopg.connect(db_url, autocommit=True) as look:
        reader.execute(SQL["lock_card"], {"id": leases["3"].file_id})

        def waiters() -> int:
            row = look.execute(SQL["lock_waiters"]).fetchone()
            return int(row[0]) if row else 0

        def hand_back(batch: list[Lease]) -> set[uuid.UUID]:
            async def go() -> set[uuid.UUID]:
                own = await open_pool(db_url, min_size=1, max_size=1)
                try:
                    return await make_queue(own).release(batch)
                finally:
                    await own.close()
            return asyncio.run(go())

        with concurrent.futures.ThreadPoolExecutor(2) as threads:
            later = threads.submit(hand_back, second)
            await asyncio.to_thread(wait_for, lambda: waiters() >= 1, interval=0.005,
                                    what="the second hand-back to wait for the reader")
            sooner = threads.submit(hand_back, first)
            # It either goes through, or waits for a clock the second holds.
            await asyncio.to_thread(wait_for, lambda: sooner.done() or waiters() >= 2,
                                    interval=0.005, what="the first hand-back to settle")
            reader.rollback()
            done = sooner.result(timeout=60) | later.result(timeout=60)
    assert done == {lease.file_id for lease in leases.values()}


async def test_a_hand_back_of_a_lease_taken_over_and_the_new_holders_failure_both_go(
        pool: Any, db_url: str) -> None:
    """A stopping worker hands back a card whose lease another worker took over (with
    cards of two owners), while that worker fails the card: each waits for a lock the
    other holds, and PostgreSQL ends one of them to break the circle. The one it ended
    did nothing, and is sent again: both go through (found by attack: the victim's error
    reached the worker, a heartbeat's would have ended its heartbeats)."""
    await add(pool_queue := make_queue(pool, worker="w2"), "alice", 2)
    await add(pool_queue, "bob")
    w2 = {lease.file_id: lease for lease in await pool_queue.claim(3)}
    alice = [lease for lease in w2.values() if lease.owner == "alice"]
    taken = alice[0].file_id
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(SQL["expire_lease"], {"id": taken})
    w1 = make_queue(pool, worker="w1")
    [lease1] = await w1.claim(1)
    assert lease1.file_id == taken
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as look:
        holder.execute(SQL["lock_owner_clock"], {"owner": "bob", "priority": "interactive"})

        def waiters() -> int:
            row = look.execute(SQL["lock_waiters"]).fetchone()
            return int(row[0]) if row else 0

        def run(call: Callable[[Queue], Awaitable[object]], worker: str) -> object:
            async def go() -> object:
                own = await open_pool(db_url, min_size=1, max_size=1)
                try:
                    return await call(make_queue(own, worker=worker))
                finally:
                    await own.close()
            return asyncio.run(go())

        with concurrent.futures.ThreadPoolExecutor(2) as threads:
            # w2's hand-back takes alice's clock, then waits for bob's.
            handed = threads.submit(run, lambda q: q.release(list(w2.values())), "w2")
            await asyncio.to_thread(wait_for, lambda: waiters() >= 1, interval=0.005,
                                    what="the hand-back to wait for bob's clock")
            # w1's failure locks the card, then waits for alice's clock.
            failed = threads.submit(
                run, lambda q: q.fail(lease1, ErrorCode.PROCESSING_TIMEOUT), "w1")
            await asyncio.to_thread(wait_for, lambda: failed.done() or waiters() >= 2,
                                    interval=0.005, what="the failure to wait")
            holder.rollback()
            released = handed.result(timeout=60)
            failed.result(timeout=60)
    assert released == set(w2) - {taken}


@pytest.mark.parametrize("requeue", ["release", "fail", "defer", "defer_counted"])
async def test_a_requeue_whose_lease_was_lost_while_it_waited_moves_no_clock(
        pool: Any, db_url: str, requeue: str) -> None:
    """A re-queue (a hand-back, a transient failure, a deferral) waits for its card's lock
    while another attempt takes the lease over: it moves nothing, and its owner's clock
    neither (found by attack: the stamp was taken before the card's lock, so the clock
    moved for a card that stayed)."""
    q = make_queue(pool)
    await add(q, "alice")
    [lease] = await q.claim(1)
    clock = {"owner": "alice", "priority": "interactive"}
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "release": lambda: q.release([lease]),
        "fail": lambda: q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE),
        "defer": lambda: q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0),
        "defer_counted": lambda: q.defer_counted(lease, ErrorCode.STORAGE_UNAVAILABLE)}
    with psycopg.connect(db_url) as other, psycopg.connect(db_url, autocommit=True) as look:
        [(before,)] = look.execute(SQL["owner_clock"], clock).fetchall()
        other.execute(SQL["take_over_lease"], {"id": lease.file_id})
        requeuing = asyncio.ensure_future(calls[requeue]())

        def blocked() -> bool:
            row = look.execute(SQL["lock_waiters"]).fetchone()
            return bool(row and row[0] > 0)

        await asyncio.to_thread(wait_for, blocked, interval=0.005,
                                what="the re-queue to wait for the card")
        other.commit()
        if requeue == "release":
            assert await requeuing == set()
        else:
            with pytest.raises(LeaseLost):
                await requeuing
        [(after,)] = look.execute(SQL["owner_clock"], clock).fetchall()
    assert after == before


async def test_repeated_confirm_stamps_once(pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    [a] = await add(q, "a")
    await confirm(q, a, "a", "v1")
    [a2] = await add(q, "a")
    with psycopg.connect(db_url) as conn:
        s: dict[uuid.UUID, Any] = dict(
            conn.execute(SQL["fair_stamps"]).fetchall())
    assert s[a2] - s[a] == 1


async def test_rederive_keeps_the_old_derivative_until_the_new_one_is_published(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool, fingerprint="old")
    [fid] = await add(q, "a")
    [lease] = await q.claim(1)
    await q.complete(lease, derived_for(lease))
    new = make_queue(pool, fingerprint="new")
    assert await Reads(new.db).rederive_owners("new") == {"a": 1}
    assert await Reads(new.db).rederive_owners("old") == {}
    assert await new.rederive("a", "new") == 1
    assert await new.rederive("a", "new") == 0  # a repeat queues nothing twice
    reads = Reads(new.db)
    assert await reads.rederive_pending() == 1 and await reads.rederive_pending("b") == 0
    with psycopg.connect(db_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(SQL["card"], {"id": fid}).fetchone()
        assert row is not None
        assert row["status"] == "queued" and row["priority"] == "bulk"
        assert row["derived_key"] == derived_key(lease) and row["attempts"] == 0
    [again] = await new.claim(1)
    assert again.file_id == fid and again.attempt == 1
    await new.complete(again, derived_for(again))
    assert await Reads(new.db).rederive_pending() == 0
    with psycopg.connect(db_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(SQL["card"], {"id": fid}).fetchone()
        assert row is not None
        assert row["status"] == "ready" and row["derive_fingerprint"] == "new"
        assert row["derived_key"] == derived_key(again)
        orphans = conn.execute(SQL["orphans"]).fetchall()
        kinds = [r["kind"] for r in conn.execute(SQL["event_kinds"], {"id": fid})]
    assert [(o["object_key"], o["reason"]) for o in orphans] == [
        (derived_key(lease), "superseded")]
    assert kinds == ["claimed", "ready", "rederive", "claimed", "ready"]
    assert await Reads(new.db).rederive_owners("new") == {}


async def test_backlog_figures(pool: Any) -> None:
    q = make_queue(pool)
    await add(q, "a", 3)
    await add(q, "b", 1, Priority.BULK)
    stats = (await read_stats(q.db, top=1)).to_json()
    backlog = stats["backlog"]
    assert backlog["by_priority"]["interactive"]["waiting"] == 3
    assert backlog["by_priority"]["bulk"]["waiting"] == 1
    assert backlog["owners_waiting"] == 2
    [top] = backlog["top_owners"]
    assert top["owner"] == "a" and top["waiting"] == 3 and top["interactive"] == 3
    assert top["oldest_wait_seconds"] >= 0
    assert stats["rederive_pending"] == 0


async def test_single_uploaders_do_not_starve_a_backlog(pool: Any, db_url: str) -> None:
    """One slot; three owners upload one photo each the moment their previous one is
    claimed, beside a backlog: the backlog owner still gets one claim in every round."""
    q = make_queue(pool)
    await add(q, "big", 20)
    singles = ["s1", "s2", "s3"]
    for owner in singles:
        await add(q, owner)
    claimed: list[str] = []
    for _ in range(24):
        [lease] = await q.claim(1)
        claimed.append(lease.owner)
        await q.complete(lease, derived_for(lease))
        if lease.owner in singles:
            await add(q, lease.owner)
    gaps = [i for i, owner in enumerate(claimed) if owner == "big"]
    # Four owners with due work: at most three claims between two of big's.
    assert len(gaps) >= 6, claimed
    assert all(b - a <= 4 for a, b in zip([-1, *gaps], gaps, strict=False)), claimed
    for owner in singles:
        assert claimed.count(owner) >= 5, claimed


@pytest.mark.parametrize("requeue", ["fail", "defer", "release"])
async def test_a_card_queued_again_takes_a_new_place_in_its_owners_line(
        pool: Any, db_url: str, requeue: str) -> None:
    """A retried, deferred or handed-back card is stamped like a new one: it goes behind
    its owner's waiting cards, and never in front of another owner's turn."""
    q = make_queue(pool)
    a = await add(q, "a", 3)
    b = await add(q, "b", 3)
    [lease] = await q.claim(1)
    assert lease.file_id == a[0]
    if requeue == "fail":
        assert await q.fail(lease, ErrorCode.STORAGE_UNAVAILABLE) == "queued"
    elif requeue == "defer":
        await q.defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0)
    else:
        assert await q.release([lease]) == {lease.file_id}
    assert await claim_order(q) == [b[0], a[1], b[1], a[2], b[2], a[0]]


async def test_a_card_in_backoff_does_not_hold_the_head_back(pool: Any, db_url: str) -> None:
    q = make_queue(pool, retry_base_seconds=3600.0, retry_cap_seconds=3600.0,
                   rng=random.Random(7))
    a = await add(q, "a", 6)
    [first] = await q.claim(1)
    assert await q.fail(first, ErrorCode.STORAGE_UNAVAILABLE) == "queued"  # an hour's wait
    for expected in a[1:4]:
        [lease] = await q.claim(1)
        assert lease.file_id == expected
        await q.complete(lease, derived_for(lease))
    b = await add(q, "b", 3)
    [c] = await add(q, "c")
    # Three owners with due work: a is passed over at most twice before its next turn.
    assert await claim_order(q) == [b[0], c, a[4], b[1], a[5], b[2]]


async def test_bulk_gets_its_share_while_interactive_work_waits(pool: Any,
                                                                db_url: str) -> None:
    q = make_queue(pool)  # DARKROOM_BULK_SHARE 0.1
    await add(q, "a", 30)
    bulk = await add(q, "b", 5, Priority.BULK)
    order = []
    for _ in range(20):
        [lease] = await q.claim(1)
        order.append(lease.file_id)
        await q.complete(lease, derived_for(lease))
    # Exactly one claim in ten, and interactive work first otherwise.
    assert [i for i, f in enumerate(order) if f in bulk] == [9, 19]
    assert order[9] == bulk[0] and order[19] == bulk[1]


async def test_bulk_share_in_a_claim_of_several(pool: Any, db_url: str) -> None:
    q = make_queue(pool, bulk_share=0.25)
    await add(q, "a", 20)
    bulk = set(await add(q, "b", 10, Priority.BULK))
    leases = await q.claim(8)
    assert sum(lease.file_id in bulk for lease in leases) == 2
    # No share: bulk runs only on slots no interactive card wants.
    none = make_queue(pool, bulk_share=0.0)
    leases = await none.claim(8)
    assert sum(lease.file_id in bulk for lease in leases) == 0


async def test_concurrent_claims_leave_the_virtual_time_at_the_last_card_claimed(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    for owner in ("a", "b", "c", "d"):
        await add(q, owner, 5)
    leases = [lease for got in await asyncio.gather(*(q.claim(2) for _ in range(8)))
              for lease in got]
    assert len(leases) == 16
    with psycopg.connect(db_url) as conn:
        keys = conn.execute(SQL["fair_places_among"],
                            {"ids": [lease.file_id for lease in leases]}).fetchall()
        head = conn.execute(SQL["interactive_head"]).fetchone()
        waiting = conn.execute(SQL["first_waiting_stamp"]).fetchone()
    assert head == keys[0]
    assert waiting is not None and waiting[0] >= head[0]


def _claim_in_lane(lane: int) -> uuid.UUID:
    """A claim id whose claim moves `lane` of the heads (migration 0021)."""
    while True:
        claim = uuid.uuid4()
        if claim.bytes[15] % 32 == lane:
            return claim


async def test_claims_of_one_class_from_two_workers_do_not_wait_for_each_other(
        pool: Any, db_url: str) -> None:
    """A claim moves the head in its own lane: another worker's claim, its transaction
    still open, does not hold this one up (they used to share one row of fair_clock)."""
    q = make_queue(pool)
    for owner in ("a", "b"):
        await add(q, owner, 2)
    first = psycopg.connect(db_url)
    second = psycopg.connect(db_url, autocommit=True)
    try:
        params = claim_params(n=1, claim=_claim_in_lane(1), max_attempts=3, lease_seconds=60,
                              worker="w1", bulk_share=0.1)
        [mine] = first.execute(QUERIES["claim"], params).fetchall()  # not committed
        second.execute("SET lock_timeout = '2s'")
        theirs = second.execute(QUERIES["claim"], {**params, "claim": _claim_in_lane(2),
                                                   "worker": "w2"}).fetchall()
        assert len(theirs) == 1 and theirs[0][0] != mine[0]
        first.commit()
        with psycopg.connect(db_url) as conn:
            keys = conn.execute(SQL["fair_places_among"],
                                {"ids": [mine[0], theirs[0][0]]}).fetchall()
            head = conn.execute(SQL["interactive_head"]).fetchone()
        assert head == keys[0]  # the greatest of the lanes: the last card claimed
    finally:
        first.close()
        second.close()


async def test_a_head_moved_by_a_claim_of_the_previous_release_counts(
        pool: Any, db_url: str) -> None:
    """In a rolling deploy a worker of the previous release still moves fair_clock's head
    columns: a card stamped now never sorts at or before the card that claim took."""
    q = make_queue(pool)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SQL["previous_release_moves_the_head"], {"vtime": 5.0, "vowner": "z"})
    [card] = await add(q, "a")
    with psycopg.connect(db_url) as conn:
        [(stamp, owner)] = conn.execute(SQL["fair_places_among"], {"ids": [card]}).fetchall()
    assert (stamp, owner) > (5.0, "z")


def test_the_claim_reads_the_line_in_order_when_one_owner_holds_the_backlog(
        db_url: str) -> None:
    """One owner's backlog (a personal server's): the claim still reads the due index in
    fair-share order and stops at its limit, instead of sorting every waiting card."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for priority in ("interactive", "bulk"):
            ids = [uuid.uuid4() for _ in range(5000)]
            conn.execute(SQL["seed_stamped_line"],
                         {"owner": "alice", "priority": priority, "ids": ids,
                          "keys": [original_key(i, "alice") for i in ids]})
        conn.execute(SQL["analyze_cards"])
        plan = "\n".join(r[0] for r in conn.execute(
            ("EXPLAIN " + QUERIES["claim"]).encode(),
            claim_params(n=4, max_attempts=3, claim=uuid.uuid4(), lease_seconds=60,
                         worker="w", bulk_share=0.1)).fetchall())
    # A sort of archive_files rows: every due card read and ordered at each claim.
    assert "Sort Key: archive_files" not in plan, plan


async def test_a_hand_back_naming_a_lease_twice_moves_its_clock_once(
        pool: Any, db_url: str) -> None:
    """A lease listed twice in one hand-back is one card: its owner's clock moves once,
    to the card's stamp (found by attack: it moved twice, and the owner lost a turn)."""
    q = make_queue(pool)
    await add(q, "alice")
    [lease] = await q.claim(1)
    clock = {"owner": "alice", "priority": "interactive"}
    with psycopg.connect(db_url, autocommit=True) as look:
        [(prev,)] = look.execute(SQL["owner_clock"], clock).fetchall()
        [(expected,)] = look.execute(SQL["stamp_after"],
                                     {**clock, "prev": prev, "weight": 1}).fetchall()
        assert await q.release([lease, lease]) == {lease.file_id}
        [(after,)] = look.execute(SQL["owner_clock"], clock).fetchall()
        [(stamp, _)] = look.execute(SQL["fair_places_among"],
                                    {"ids": [lease.file_id]}).fetchall()
    assert after == stamp == expected
