"""The worker's completer against a real database: batches, and each row's own fence."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
import pytest

from darkroom.completer import Completer, running
from darkroom.queue import Derived, Lease, Queue, derived_key
from darkroom.reads import Reads
from darkroom.stats import read as read_stats
from tests.support.services import confirm, make_queue, wait_until
from tests.support.sql import SQL


async def new_queued(q: Any, n: int) -> None:
    for i in range(n):
        card = await q.create_file(owner="o", filename=f"f{i}.jpg",
                                   content_type="image/jpeg", size=1)
        await confirm(q, card.id, "o", "v1")


def result(lease: Lease) -> Derived:
    return Derived(derived_key(lease), "v", "0" * 64, 1, 1, 1)


async def test_results_that_finish_together_commit_in_one_statement(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q, 12)
    leases = await q.claim(12)
    with psycopg.connect(db_url, autocommit=True) as conn:  # one lease lost meanwhile
        conn.execute(SQL["expire_lease"], {"id": leases[0].file_id})
    [thief] = await q.claim(1)
    assert thief.file_id == leases[0].file_id
    statements = 0

    async def counting(call: Callable[[], Awaitable[set[uuid.UUID]]],
                     _leases: Sequence[Lease]) -> set[uuid.UUID]:
        nonlocal statements
        statements += 1
        return await call()

    completer = Completer(q, counting)
    async with running(completer):
        answers = await asyncio.gather(*(completer.complete(lease, result(lease))
                                         for lease in leases))
    assert answers == [False] + [True] * 11
    assert statements == 1
    stats = (await read_stats(q.db)).to_json()
    assert stats["counts"]["ready"] == 11 and stats["lease_lost_total"] == 1


async def test_a_failed_batch_fails_each_of_its_jobs(pool: Any) -> None:
    q = make_queue(pool)
    await new_queued(q, 2)
    leases = await q.claim(2)

    async def broken(call: Callable[[], Awaitable[set[uuid.UUID]]],
                     _leases: Sequence[Lease]) -> set[uuid.UUID]:
        raise psycopg.OperationalError("the database went away")

    completer = Completer(q, broken)
    async with running(completer):
        answers = await asyncio.gather(*(completer.complete(lease, result(lease))
                                         for lease in leases), return_exceptions=True)
    assert all(isinstance(a, psycopg.OperationalError) for a in answers)


class HoldsFirst:
    """The completer's retry (completer.Retry) holding the first batch's statement until
    `released`, as a batch being tried again through a fault is; counts the statements,
    and the most that were on their way at once."""

    def __init__(self, *, hold: bool = True) -> None:
        self.calls = 0
        self.in_flight = self.most_in_flight = 0
        self.sent = asyncio.Event()  # the first batch is on its way, and held
        self.released = asyncio.Event()
        if not hold:
            self.released.set()

    async def __call__(self, call: Callable[[], Awaitable[set[uuid.UUID]]],
                       _leases: Sequence[Lease]) -> set[uuid.UUID]:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.calls == 1:
                self.sent.set()
                await self.released.wait()
            return await call()
        finally:
            self.in_flight -= 1


async def test_a_batch_being_tried_again_does_not_hold_up_the_next(pool: Any) -> None:
    """The first batch's statement is being tried again (its connections keep being cut);
    a job that finishes meanwhile is committed beside it, not after it."""
    q = make_queue(pool)
    await new_queued(q, 2)
    first, second = await q.claim(2)
    held = HoldsFirst()
    completer = Completer(q, held)
    async with running(completer):
        one = asyncio.ensure_future(completer.complete(first, result(first)))
        await asyncio.wait_for(held.sent.wait(), 10)
        assert await asyncio.wait_for(completer.complete(second, result(second)), 10) is True
        assert not one.done()
        row = await Reads(q.db).get_file(second.file_id, "o")
        assert row is not None and row.status == "ready"
        held.released.set()
        assert await asyncio.wait_for(one, 10) is True
    assert held.calls == 2


@pytest.mark.parametrize("full_batches", [1, 2])
async def test_full_batches_go_beside_the_one_in_flight_two_at_most(
        pool: Any, full_batches: int) -> None:
    """A batch in flight is held; full batches of results that arrive meanwhile are
    committed beside it, not after it (results gather only while a batch is not full),
    and never three statements at once (the worker's heartbeats share its four
    connections): the second goes once the first beside it settled."""
    q = make_queue(pool)
    await new_queued(q, 1 + 2 * full_batches)
    first, *rest = await q.claim(1 + 2 * full_batches)
    held = HoldsFirst()
    # Gathering would wait for the held batch far longer than this test's deadlines.
    completer = Completer(q, held, max_batch=2, gather_seconds=600)
    async with running(completer):
        one = asyncio.ensure_future(completer.complete(first, result(first)))
        await asyncio.wait_for(held.sent.wait(), 10)
        answers = await asyncio.wait_for(
            asyncio.gather(*(completer.complete(lease, result(lease)) for lease in rest)), 10)
        assert answers == [True] * len(rest) and not one.done()
        held.released.set()
        assert await asyncio.wait_for(one, 10) is True
    assert (held.calls, held.most_in_flight) == (1 + full_batches, 2)


async def test_the_completer_ends_after_the_batches_it_cancels(pool: Any, db_url: str) -> None:
    """A stop while a batch's statement waits on the server (for a row lock here): the
    completer ends only once that batch has ended, so whatever it hands over (a claim's
    leases) comes before the worker's last hand-back (found by attack: the batch was
    still cancelling its statement when the completer ended)."""
    q = make_queue(pool)
    await new_queued(q, 1)
    [lease] = await q.claim(1)
    counted = HoldsFirst(hold=False)
    completer = Completer(q, counted)

    def waiting() -> bool:
        with psycopg.connect(db_url, autocommit=True) as look:
            row = look.execute(SQL["lock_waiters"]).fetchone()
        return row is not None and row[0] == 1

    with psycopg.connect(db_url) as blocker:
        blocker.execute(SQL["lock_card"], {"id": lease.file_id})
        async with running(completer):
            answer = asyncio.ensure_future(completer.complete(lease, result(lease)))
            await wait_until(waiting, timeout=10, what="the batch to wait on the row")
        assert counted.in_flight == 0
        assert answer.cancelled()
        blocker.rollback()


class Refilled:
    """A refill (completer.Refill) that asks for `n` cards with every batch, and records."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.leases: list[Lease] = []
        self.unknown_claims: list[uuid.UUID] = []
        self.heard_before_answers: list[bool] = []
        self.answers: list[asyncio.Future[bool]] = []

    def wanted(self, finishing: int) -> int:
        return self.n

    def claimed(self, leases: list[Lease], asked: int, sent: float) -> None:
        assert asked == self.n
        self.heard_before_answers.append(not any(a.done() for a in self.answers))
        self.leases += leases

    def unknown(self, claim_id: uuid.UUID, asked: int, sent: float) -> None:
        self.unknown_claims.append(claim_id)


async def direct(call: Callable[[], Awaitable[set[uuid.UUID]]],
                 _leases: Sequence[Lease]) -> set[uuid.UUID]:
    return await call()


def kinds(db_url: str) -> list[tuple[str, int]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(SQL["event_kind_counts"]).fetchall()


async def test_a_batch_commits_with_the_claim_of_the_slots_it_frees(
        pool: Any, db_url: str) -> None:
    q = make_queue(pool)
    await new_queued(q, 5)
    leases = await q.claim(2)
    refill = Refilled(2)
    completer = Completer(q, direct, refill=refill)
    async with running(completer):
        refill.answers = [completer.submit(lease, result(lease)) for lease in leases]
        assert await asyncio.gather(*refill.answers) == [True, True]
    # Handed over before the jobs heard their answers: their slots are refilled at once.
    assert refill.heard_before_answers == [True]
    assert len(refill.leases) == 2
    assert {lease.attempt for lease in refill.leases} == {1}
    assert {lease.file_id for lease in refill.leases}.isdisjoint(
        {lease.file_id for lease in leases})
    assert kinds(db_url) == [("claimed", 4), ("ready", 2)]


async def test_a_commit_with_a_claim_whose_answer_was_lost_ends_right(
        pool: Any, db_url: str) -> None:
    """Committed, answer lost: the commits are repeated and recognized as published, and
    the claim's leases are found by its id, each started once. Not committed: the commits
    go through on their own, and the claim leased nothing."""
    from darkroom.queue import ClaimUnknown, Queue

    class AnswerLost(Queue):
        """The network of this test: the pair commits (or not), its answer never comes."""

        commits = True

        async def complete_and_claim(self, results: Sequence[tuple[Lease, Derived]], n: int,
                                     claim_id: uuid.UUID | None = None, *,
                                     claimed: Callable[[list[Lease]], None] | None = None,
                                     ) -> tuple[set[uuid.UUID], list[Lease]]:
            claims.append(claim_id or uuid.uuid4())
            if self.commits:  # committed; its answer, the leases included, never comes
                await super().complete_and_claim(results, n, claims[-1])
            raise ClaimUnknown(claims[-1]) from psycopg.OperationalError("cut")

    claims: list[uuid.UUID] = []
    q = AnswerLost(make_queue(pool).db, lease_seconds=30.0, max_attempts=3,
                   retry_base_seconds=0.0, retry_cap_seconds=0.0, worker="test")
    await new_queued(q, 6)
    for commits in (True, False):
        q.commits = commits
        leases = await q.claim(2)
        refill = Refilled(2)
        completer = Completer(q, direct, refill=refill)
        async with running(completer):
            answers = [completer.submit(lease, result(lease)) for lease in leases]
            assert await asyncio.gather(*answers) == [True, True]
        assert refill.unknown_claims == claims[-1:]
        adopted = await q.adopt_claim(claims[-1])
        if commits:
            assert len(adopted) == 2 and {lease.attempt for lease in adopted} == {1}
            for lease in adopted:
                assert await q.complete_many([(lease, result(lease))]) == set()
        else:
            assert adopted == []
    assert kinds(db_url) == [("claimed", 6), ("ready", 6)]


class Watched(Queue):
    """A queue that says when a batch's claim has committed (`claimed`), before the rows
    the common case left are committed."""

    def __init__(self, q: Queue) -> None:
        super().__init__(q.db, lease_seconds=q.lease_seconds, max_attempts=q.max_attempts,
                         retry_base_seconds=0.0, retry_cap_seconds=0.0, worker=q.worker,
                         fingerprint=q.fingerprint)
        self.committed = asyncio.Event()

    async def complete_and_claim(self, results: Sequence[tuple[Lease, Derived]], n: int,
                                 claim_id: uuid.UUID | None = None, *,
                                 claimed: Callable[[list[Lease]], None] | None = None,
                                 ) -> tuple[set[uuid.UUID], list[Lease]]:
        def seen(leases: list[Lease]) -> None:
            if claimed is not None:
                claimed(leases)
            self.committed.set()

        return await super().complete_and_claim(results, n, claim_id, claimed=seen)


async def rederive_and_one_queued(pool: Any) -> tuple[Watched, Lease]:
    """A re-derive's lease (left by the common case to the whole commit) and one more
    queued card, for the batch's claim."""
    old = make_queue(pool, fingerprint="old")
    await new_queued(old, 1)
    [first] = await old.claim(1)
    await old.complete_many([(first, result(first))])
    q = Watched(make_queue(pool, fingerprint="new"))
    assert await q.rederive("o", "new") == 1
    [lease] = await q.claim(1)
    await new_queued(q, 1)
    return q, lease


async def test_a_claim_reaches_the_worker_once_the_rows_its_batch_left_are_committed(
        pool: Any, db_url: str) -> None:
    """Until then it still counts as in flight, so the worker's own claims, which rescue
    expired leases first, cannot take a row of the batch (a re-derive whose lease ran
    out) from under its commit."""
    q, lease = await rederive_and_one_queued(pool)
    refill = Refilled(1)
    completer = Completer(q, direct, refill=refill)
    async with running(completer):
        with psycopg.connect(db_url) as blocker:  # the re-derive's row: `complete` waits
            blocker.execute(SQL["lock_card"], {"id": lease.file_id})
            answer = completer.submit(lease, result(lease))
            async with asyncio.timeout(10):
                await q.committed.wait()
            assert refill.leases == [] and not answer.done()
            blocker.rollback()
        assert await answer is True
    [spare] = refill.leases
    assert spare.file_id != lease.file_id
    assert refill.heard_before_answers == [True]


async def test_a_stop_between_a_claim_and_the_rows_its_batch_left_hands_the_claim_over(
        pool: Any, db_url: str) -> None:
    """A stop that cancels the completer while the rows left are being committed does not
    lose the claim's leases: the worker holds them, and hands them back."""
    q, lease = await rederive_and_one_queued(pool)
    refill = Refilled(1)
    completer = Completer(q, direct, refill=refill)
    with psycopg.connect(db_url) as blocker:
        blocker.execute(SQL["lock_card"], {"id": lease.file_id})
        task = asyncio.create_task(completer.run())
        answer = completer.submit(lease, result(lease))
        async with asyncio.timeout(10):
            await q.committed.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        blocker.rollback()
    async with asyncio.timeout(10):  # the batch's own cancellation settles it
        await asyncio.gather(answer, return_exceptions=True)
    assert answer.cancelled()
    [spare] = refill.leases
    assert spare.file_id != lease.file_id
