"""A Hypothesis state machine drives several simulated workers against the real queue.

The clock is controlled by moving a lease's `lease_until` into the past ("expire"), so
every interleaving of claim, heartbeat, commit, failure, expiry, release, revoke,
re-derive and retry that Hypothesis finds is checked against the protocol's invariants
after every step. A re-derive that fails for good (a failure, or attempts exhausted at a
claim) leaves the photo ready with its previous derivative; a retry takes back only
rejected cards, and a retry repeated after its answer was lost queues nothing twice.
Unknown outcomes are rules too: a statement repeated after it committed (its answer
lost) must be recognized as the same success, and a claim whose answer was lost is
adopted. Commits come one by one and in batches; the sweeper's orphan unit and
reconciliation run between any two steps against a real local store, and no object a card
references may ever go.

Fair share is judged after every claim. Cards belong to owners who add backlogs and owners
who upload one card at a time (only once their previous one has left the queue), in both
priorities, and are retried, deferred and handed back. An owner with due work is passed
over by at most (owners with due work in its class - 1) claims of its class per claim it
gets, whatever the retries and hand-backs (a deleted waiting card keeps its turn
reserved, so each costs its owner at most one round). Bulk work gets exactly its owed
share while interactive work stays due, and at least DARKROOM_BULK_SHARE of the claims
(less one) while both classes have work due.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from psycopg.rows import dict_row

from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.errors import RETRYABLE_CODES, TRANSIENT_CODES, ErrorCode
from darkroom.queue import Derived, Lease, LeaseLost, Priority, Queue, claim_params, derived_key
from darkroom.storage import open_store
from darkroom.sweeper import Orphans, Reconcile
from tests.support.services import confirm, examples
from tests.support.sql import SQL, Attempt

MAX_ATTEMPTS = 3
WORKERS = 3
OWNERS = ("a", "b", "c")  # add backlogs
SINGLES = ("s1", "s2")  # upload one card at a time
SHARE = Decimal("0.25")  # DARKROOM_BULK_SHARE of these queues


def make_machine(db_url: str) -> type[RuleBasedStateMachine]:
    class LeaseProtocol(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.db = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
            self.db.execute(SQL["truncate_queue"])
            self.db.execute(SQL["reset_fair_clock"])
            self.objects = Path(tempfile.mkdtemp(prefix="darkroom-stateful-"))
            self.store = open_store(self.objects.as_uri())
            self.pool = self.run(open_pool(db_url, min_size=1, max_size=2))
            self.queues = [
                Queue(Database(self.pool), lease_seconds=60, max_attempts=MAX_ATTEMPTS,
                      retry_base_seconds=0, retry_cap_seconds=0, worker=f"w{i}",
                      bulk_share=float(SHARE))
                for i in range(WORKERS)
            ]
            self.held: list[list[Lease]] = [[] for _ in range(WORKERS)]
            self.files: list[uuid.UUID] = []
            self.published: dict[uuid.UUID, uuid.UUID] = {}  # file -> token that published
            self.starts: dict[uuid.UUID, int] = {}
            self.owner_of: dict[uuid.UUID, str] = {}
            self.superseded: dict[uuid.UUID, uuid.UUID] = {}  # file -> token it replaces
            # Fair share, per (owner, class) with due work: the claims of its class that
            # passed it since it last got one (or began to wait), and the owners of the
            # class with due work meanwhile (itself included).
            self.passed: dict[tuple[str, str], int] = {}
            self.seen: dict[tuple[str, str], set[str]] = {}
            # Waiting cards deleted, per (owner, class): each may cost one round.
            self.revoked_waiting: dict[tuple[str, str], int] = {}
            # Bulk's share while both classes have work due: slots claimed, bulk's.
            self.both_claims = 0
            self.both_bulk = 0
            self.derived: dict[uuid.UUID, Derived] = {}
            # Statements that went through, to be repeated as if their answer was lost.
            self.finished: list[tuple[int, Lease, str, ErrorCode | None]] = []
            # Retry runs whose answer was lost: (owner, run, codes, the cards it moved),
            # and the run that re-queued each card last.
            self.lost_retries: list[tuple[str, uuid.UUID, Sequence[str] | None,
                                          set[uuid.UUID]]] = []
            self.retried_by: dict[uuid.UUID, uuid.UUID] = {}

        def run(self, coro: Any) -> Any:
            return self.loop.run_until_complete(coro)

        def teardown(self) -> None:
            self.run(self.pool.close())
            self.loop.close()
            self.db.close()
            shutil.rmtree(self.objects, ignore_errors=True)

        def derive(self, w: int, lease: Lease) -> Derived:
            """What an attempt does before its commit: PUT (the key carries its token)."""
            key = derived_key(lease)
            version = self.store.put(key, b"webp")
            return Derived(key, version, "0" * 64, 1, 1, 4)

        def row(self, file_id: uuid.UUID) -> dict[str, Any]:
            found = self.db.execute(SQL["card"], {"id": file_id}).fetchone()
            assert found is not None
            return found

        def holds_lease(self, lease: Lease) -> bool:
            r = self.row(lease.file_id)
            return bool(r["status"] == "processing" and r["lease_token"] == lease.token)

        @rule(owner=st.sampled_from(OWNERS), n=st.integers(1, 12),
              priority=st.sampled_from(list(Priority)))
        def add_files(self, owner: str, n: int, priority: Priority) -> None:
            for _ in range(n):
                card = self.run(self.queues[0].create_file(
                    owner=owner, filename="x.jpg", content_type="image/jpeg", size=1,
                    priority=priority))
                self.run(confirm(self.queues[0], card.id, owner, "v1"))
                self.files.append(card.id)
                self.owner_of[card.id] = owner

        @rule(owner=st.sampled_from(SINGLES))
        def upload_one(self, owner: str) -> None:
            """A user who uploads the next photo once the previous one has left the
            queue (claimed, or done)."""
            found = self.db.execute(SQL["queued_of_owner"], {"owner": owner}).fetchone()
            assert found is not None
            if found["n"] == 0:
                self.add_files(owner, 1, Priority.INTERACTIVE)

        def due(self) -> list[dict[str, Any]]:
            return self.db.execute(SQL["due_cards"]).fetchall()

        def slots_for_due(self, n: int) -> int:
            """The slots a claim of `n` leaves to due cards: expired leases go first."""
            found = self.db.execute(SQL["expired_lease_count"]).fetchone()
            assert found is not None
            return max(n - int(found["n"]), 0)

        def bulk_credit(self) -> Decimal:
            found = self.db.execute(SQL["bulk_credit"]).fetchone()
            assert found is not None
            return Decimal(found["bulk_credit"])

        @rule(w=st.integers(0, WORKERS - 1), n=st.integers(1, 4))
        def claim(self, w: int, n: int) -> None:
            due, k, credit = self.due(), self.slots_for_due(n), self.bulk_credit()
            leases = self.run(self.queues[w].claim(n))
            for lease in leases:
                self.starts[lease.file_id] = self.starts.get(lease.file_id, 0) + 1
                assert lease.attempt == self.starts[lease.file_id]
            self.held[w].extend(leases)
            self.settle_failed_rederives()
            # What the claim took of the due cards: leased, or ended as attempts_exhausted.
            still = {r["id"] for r in self.due()}
            self.check_fair(due, [r["id"] for r in due if r["id"] not in still], k, credit)

        def settle_failed_rederives(self) -> None:
            """A re-derive that ended for good without publishing: the photo is ready again
            with the derivative it had, the failure on the card."""
            for file_id, token in list(self.superseded.items()):
                r = self.row(file_id)
                if r["status"] == "ready" and file_id not in self.published:
                    assert r["rederive_error"] is not None and r["error_code"] is None
                    assert r["derived_key"] == derived_key(Attempt(file_id, token))
                    self.published[file_id] = self.superseded.pop(file_id)

        def check_fair(self, due: list[dict[str, Any]], taken: list[uuid.UUID], k: int,
                       credit: Decimal) -> None:
            """Priority, bulk's share and fair share, judged from the due cards before a
            claim that had `k` slots for them, with bulk's credit before it."""
            due_class = {r["id"]: r["priority"] for r in due}
            got = [(self.owner_of[i], due_class[i]) for i in taken]
            interactive_due = sum(1 for r in due if r["priority"] == "interactive")
            bulk_due = len(due) - interactive_due
            bulk_taken = sum(1 for _, p in got if p == "bulk")
            if interactive_due > len(got) - bulk_taken:
                # Interactive work still waits: bulk got exactly what it was owed.
                owed = min(math.floor(credit + k * SHARE), k, bulk_due)
                assert bulk_taken == owed, f"bulk got {bulk_taken} claims, owed {owed}"
            if interactive_due and bulk_due > bulk_taken:
                # Both classes had work due, and bulk still has (else it got all it could).
                self.both_claims += len(got)
                self.both_bulk += bulk_taken
                assert self.both_bulk >= SHARE * self.both_claims - 1, (
                    f"bulk got {self.both_bulk} of {self.both_claims} claims")
            else:
                self.both_claims = self.both_bulk = 0
            waiting = {(r["owner"], r["priority"]) for r in due}
            for key in list(self.passed):
                if key not in waiting:  # nothing due any more: a fresh start next time
                    del self.passed[key]
                    del self.seen[key]
            for key in waiting:
                owners = {o for o, p in waiting if p == key[1]}
                if key in got:
                    self.passed[key] = 0
                    self.seen[key] = owners
                    continue
                self.passed.setdefault(key, 0)
                self.seen.setdefault(key, set()).update(owners)
                self.passed[key] += sum(1 for g in got if g[1] == key[1])
                rounds = 1 + self.revoked_waiting.get(key, 0)
                allowed = rounds * (len(self.seen[key]) - 1)
                assert self.passed[key] <= allowed, (
                    f"owner {key[0]} ({key[1]}) passed over by {self.passed[key]} claims "
                    f"with {len(self.seen[key])} owners waiting (bound {allowed})")

        @precondition(lambda self: bool(self.files))
        @rule(owner=st.sampled_from(OWNERS))
        def rederive(self, owner: str) -> None:
            """Re-derive the owner's ready cards, twice (a repeat queues nothing more)."""
            moved = self.run(self.queues[0].rederive(owner, "v2"))
            assert self.run(self.queues[0].rederive(owner, "v2")) == 0
            rows = self.db.execute(SQL["queued_rederives_of_owner"],
                                   {"owner": owner}).fetchall()
            again = [r["id"] for r in rows if r["id"] in self.published]
            assert len(again) == moved
            for file_id in again:
                # A re-derive may publish once more; the old derivative stays on the card.
                self.superseded[file_id] = self.published.pop(file_id)
                self.starts[file_id] = 0  # a re-derive has max_attempts of its own

        @precondition(lambda self: bool(self.published))
        @rule(data=st.data())
        def rederive_and_claim(self, data: st.DataObject) -> None:
            """A re-derive of a ready card's owner, and a worker taking the work at once
            (so that re-derives' attempts, and their failures, come up often)."""
            owner = self.owner_of[data.draw(st.sampled_from(list(self.published)))]
            self.rederive(owner)
            self.claim(data.draw(st.integers(0, WORKERS - 1)), 4)

        @rule()
        def claim_pass(self) -> None:
            """A rescuer claims everything claimable: no expired lease survives it."""
            self.claim(0, 1000)
            stuck = self.db.execute(SQL["expired_lease_count"]).fetchone()
            assert stuck is not None and stuck["n"] == 0

        @precondition(lambda self: any(self.held))
        @rule(data=st.data())
        def complete(self, data: st.DataObject) -> None:
            w = data.draw(st.sampled_from([i for i, h in enumerate(self.held) if h]))
            lease = self.held[w].pop(data.draw(st.integers(0, len(self.held[w]) - 1)))
            expected = self.holds_lease(lease)
            derived = self.derive(w, lease)
            self.derived[lease.token] = derived
            try:
                self.run(self.queues[w].complete(lease, derived))
                published = True
            except LeaseLost:
                published = False
            assert published == expected
            if published:
                assert lease.file_id not in self.published, "published twice"
                self.published[lease.file_id] = lease.token
                replaced = self.superseded.pop(lease.file_id, None)
                if replaced is not None:
                    old_key = derived_key(Attempt(lease.file_id, replaced))
                    orphan = self.db.execute(SQL["orphan_reason"], {"key": old_key}).fetchone()
                    assert orphan is not None and orphan["reason"] == "superseded"
                self.finished.append((w, lease, "complete", None))

        @precondition(lambda self: any(self.held))
        @rule(data=st.data(), code=st.sampled_from(list(ErrorCode)))
        def fail(self, data: st.DataObject, code: ErrorCode) -> None:
            w = data.draw(st.sampled_from([i for i, h in enumerate(self.held) if h]))
            lease = self.held[w].pop(data.draw(st.integers(0, len(self.held[w]) - 1)))
            expected = self.holds_lease(lease)
            try:
                status = self.run(self.queues[w].fail(lease, code))
            except LeaseLost:
                assert not expected
                return
            assert expected
            assert status in {"queued", "rejected", "ready"}
            # Ready: a re-derive that failed for good, never a first derive.
            assert (status == "ready") == (lease.file_id in self.superseded
                                           and status != "queued")
            self.settle_failed_rederives()
            self.finished.append((w, lease, "fail", code))

        def rederiving(self) -> list[tuple[int, int]]:
            return [(w, i) for w, held in enumerate(self.held)
                    for i, lease in enumerate(held) if lease.file_id in self.superseded]

        @precondition(lambda self: bool(self.rederiving()))
        @rule(data=st.data(), code=st.sampled_from(list(ErrorCode)))
        def fail_a_rederive(self, data: st.DataObject, code: ErrorCode) -> None:
            """A re-derive's attempt fails: queued again while it may retry, else the photo
            is ready again with the derivative it had and the code on the card."""
            w, i = data.draw(st.sampled_from(self.rederiving()))
            lease = self.held[w].pop(i)
            old_key = derived_key(Attempt(lease.file_id, self.superseded[lease.file_id]))
            expected = self.holds_lease(lease)
            try:
                status = self.run(self.queues[w].fail(lease, code))
            except LeaseLost:
                assert not expected
                return
            assert expected
            r = self.row(lease.file_id)
            again = code in TRANSIENT_CODES and lease.attempt < MAX_ATTEMPTS
            assert status == r["status"] == ("queued" if again else "ready")
            assert r["derived_key"] == old_key and r["error_code"] is None
            if not again:
                assert r["rederive_error"] == code
            self.settle_failed_rederives()
            self.finished.append((w, lease, "fail", code))

        @precondition(lambda self: any(self.held))
        @rule(data=st.data())
        def defer(self, data: st.DataObject) -> None:
            w = data.draw(st.sampled_from([i for i, h in enumerate(self.held) if h]))
            lease = self.held[w].pop(data.draw(st.integers(0, len(self.held[w]) - 1)))
            expected = self.holds_lease(lease)
            try:
                self.run(self.queues[w].defer(lease, ErrorCode.STORAGE_UNAVAILABLE, 0.0))
            except LeaseLost:
                assert not expected
                return
            assert expected
            self.starts[lease.file_id] -= 1  # the attempt is given back
            self.finished.append((w, lease, "defer", ErrorCode.STORAGE_UNAVAILABLE))

        @precondition(lambda self: bool(self.finished))
        @rule(data=st.data())
        def repeat_after_lost_answer(self, data: st.DataObject) -> None:
            """A statement that committed, sent again: the same success, or LeaseLost only
            once the card has moved on past it (another attempt settled it since)."""
            w, lease, kind, code = data.draw(st.sampled_from(self.finished))
            row = self.row(lease.file_id)
            lost_before = self.lease_lost_count()
            try:
                if kind == "complete":
                    self.run(self.queues[w].complete(lease, self.derived[lease.token]))
                elif kind == "release":
                    recognized = lease.file_id in self.run(self.queues[w].release([lease]))
                    if not recognized:
                        raise LeaseLost(lease.file_id, lease.token)
                elif kind == "fail":
                    assert code is not None
                    self.run(self.queues[w].fail(lease, code))
                else:
                    assert code is not None
                    self.run(self.queues[w].defer(lease, code, 0.0))
                recognized = True
            except LeaseLost:
                recognized = False
            if kind == "complete" and row["derived_key"] == derived_key(lease):
                # (Unless a re-derive has published another derivative since.)
                assert recognized, "a repeated publication was not recognized"
            elif row["settled_token"] == lease.token and row["status"] != "ready" and (
                    kind == "fail" or row["status"] != "rejected") and row["status"] != "deleting":
                assert recognized, f"a repeated {kind} was not recognized"
            if recognized:
                assert self.lease_lost_count() == lost_before

        @precondition(lambda self: any(len(h) >= 2 for h in self.held))
        @rule(data=st.data())
        def complete_batch(self, data: st.DataObject) -> None:
            """Several commits in one statement, each fenced by its own token."""
            w = data.draw(st.sampled_from([i for i, h in enumerate(self.held) if len(h) >= 2]))
            batch, self.held[w] = self.held[w], []
            expected = {lease.token for lease in batch if not self.holds_lease(lease)}
            results = []
            for lease in batch:
                self.derived[lease.token] = self.derive(w, lease)
                results.append((lease, self.derived[lease.token]))
            lost = self.run(self.queues[w].complete_many(results))
            assert lost == expected
            for lease in batch:
                if lease.token not in lost:
                    assert lease.file_id not in self.published, "published twice"
                    self.published[lease.file_id] = lease.token
                    self.superseded.pop(lease.file_id, None)
                    self.finished.append((w, lease, "complete", None))

        @rule()
        def sweep(self) -> None:
            """The orphan unit and reconciliation, between any two steps (guard 0)."""
            db = self.queues[0].db
            while self.run(Orphans(db, self.store, guard_seconds=0).run_once()):
                pass
            self.run(Reconcile(db, self.store, guard_seconds=0).run(dry_run=False))

        @rule(w=st.integers(0, WORKERS - 1), n=st.integers(1, 4))
        def claim_answer_lost(self, w: int, n: int) -> None:
            """The claim commits, its answer never arrives; the worker adopts by claim id."""
            claim_id = uuid.uuid4()
            due, k, credit = self.due(), self.slots_for_due(n), self.bulk_credit()
            self.db.execute(QUERIES["claim"], claim_params(
                n=n, max_attempts=MAX_ATTEMPTS, claim=claim_id, lease_seconds=60,
                worker=f"w{w}", bulk_share=float(SHARE)))
            still = {r["id"] for r in self.due()}
            self.check_fair(due, [r["id"] for r in due if r["id"] not in still], k, credit)
            leases = self.run(self.queues[w].adopt_claim(claim_id))
            for lease in leases:
                self.starts[lease.file_id] = self.starts.get(lease.file_id, 0) + 1
                assert lease.attempt == self.starts[lease.file_id]
            self.held[w].extend(leases)
            self.settle_failed_rederives()

        def rejected(self, owner: str, codes: Sequence[str] | None) -> set[uuid.UUID]:
            rows = self.db.execute(SQL["rejected_of_owner"], {"owner": owner}).fetchall()
            return {r["id"] for r in rows if codes is None or r["error_code"] in codes}

        def retried(self, moved: list[uuid.UUID], run: uuid.UUID) -> None:
            for file_id in moved:
                r = self.row(file_id)
                assert (r["status"], r["attempts"], r["error_code"], r["priority"]) == (
                    "queued", 0, None, "bulk")
                assert file_id not in self.published  # a rejected card never published
                self.starts[file_id] = 0  # a fresh attempt budget
                self.retried_by[file_id] = run

        def rejected_owners(self) -> list[str]:
            return [r["owner"] for r in self.db.execute(SQL["rejected_owners"]).fetchall()]

        @precondition(lambda self: bool(self.files))
        @rule(data=st.data(), every=st.booleans(), lost=st.booleans())
        def retry(self, data: st.DataObject, every: bool, lost: bool) -> None:
            """`darkroom retry` for one owner (mostly one with rejected cards): takes exactly
            the owner's rejected cards with a retryable code (any code with --all); run
            again, it queues nothing."""
            owner = data.draw(st.sampled_from(self.rejected_owners() or list(OWNERS)))
            codes = None if every else sorted(RETRYABLE_CODES)
            expected = self.rejected(owner, codes)
            others = {r["id"]: r["status"] for r in self.db.execute(
                SQL["card_statuses"]).fetchall() if r["id"] not in expected}
            run = uuid.uuid4()
            if lost:  # committed, its answer never read
                self.db.execute(QUERIES["retry"], {
                    "owner": owner, "id": None, "ids": None, "codes": codes, "since": None,
                    "run": run, "actor": "cli:test", "priority": "bulk", "limit": 500})
                moved = list(expected - self.rejected(owner, codes))
            else:
                moved = self.run(self.queues[0].retry(owner, run=run, actor="cli:test",
                                                      codes=codes))
            assert set(moved) == expected
            self.retried(moved, run)
            # Nothing that was not rejected (with such a code) changed status.
            now = {r["id"]: r["status"] for r in self.db.execute(
                SQL["card_statuses"]).fetchall()}
            assert {i: now[i] for i in others if i in now} == {
                i: st for i, st in others.items() if i in now}
            assert self.run(self.queues[0].retry(owner, run=run, actor="cli:test",
                                                 codes=codes)) == []
            if lost:
                self.lost_retries.append((owner, run, codes, set(moved)))

        @precondition(lambda self: bool(self.lost_retries))
        @rule(data=st.data())
        def repeat_lost_retry(self, data: st.DataObject) -> None:
            """A retry whose answer was lost, sent again later: it re-queues none of the
            cards it re-queued, even one that was rejected again since."""
            owner, run, codes, moved_before = data.draw(st.sampled_from(self.lost_retries))
            mine = {f for f in moved_before if self.retried_by.get(f) == run}
            moved = self.run(self.queues[0].retry(owner, run=run, actor="cli:test",
                                                  codes=codes))
            assert not set(moved) & mine, "a retry run queued a card twice"
            self.retried(moved, run)

        def lease_lost_count(self) -> int:
            found = self.db.execute(SQL["lease_lost_count"]).fetchone()
            assert found is not None
            return int(found["n"])

        @rule(w=st.integers(0, WORKERS - 1))
        def heartbeat(self, w: int) -> None:
            expected_lost = {lease.token for lease in self.held[w]
                             if not self.holds_lease(lease)}
            lost = self.run(self.queues[w].heartbeat(self.held[w]))
            assert lost == expected_lost
            self.held[w] = [lease for lease in self.held[w] if lease.token not in lost]

        @rule(w=st.integers(0, WORKERS - 1))
        def release(self, w: int) -> None:
            holding = {lease.file_id for lease in self.held[w] if self.holds_lease(lease)}
            released = self.run(self.queues[w].release(self.held[w]))
            assert released == holding
            self.finished += [(w, lease, "release", None) for lease in self.held[w]
                              if lease.file_id in released]
            self.held[w] = []

        @precondition(lambda self: bool(self.files))
        @rule(data=st.data())
        def expire(self, data: st.DataObject) -> None:
            file_id = data.draw(st.sampled_from(self.files))
            self.db.execute(SQL["expire_processing_lease"], {"id": file_id})

        @precondition(lambda self: bool(self.files))
        @rule(data=st.data())
        def revoke(self, data: st.DataObject) -> None:
            file_id = data.draw(st.sampled_from(self.files))
            before = self.row(file_id)
            self.run(self.queues[0].revoke(file_id, self.owner_of[file_id]))
            if before["status"] == "queued":
                key = (before["owner"], before["priority"])
                self.revoked_waiting[key] = self.revoked_waiting.get(key, 0) + 1

        @invariant()
        def protocol_holds(self) -> None:
            rows = self.db.execute(SQL["cards"]).fetchall()
            live: dict[uuid.UUID, int] = {}
            for lease in (lease for held in self.held for lease in held):
                if any(r["id"] == lease.file_id and r["lease_token"] == lease.token
                       for r in rows):
                    live[lease.file_id] = live.get(lease.file_id, 0) + 1
            assert all(n == 1 for n in live.values()), "two live leases on one row"
            for r in rows:
                assert r["attempts"] <= MAX_ATTEMPTS
                assert (r["status"] == "processing") == (r["lease_token"] is not None)
                if r["status"] == "ready":
                    token = self.published.get(r["id"])
                    assert token is not None, "ready without a fenced publication"
                    assert r["derived_key"] == derived_key(Attempt(r["id"], token))
                    # The sweeper never takes what a card shows.
                    assert self.store.get(r["derived_key"], r["derived_version"]) == b"webp"
                elif r["status"] != "deleting":
                    assert r["id"] not in self.published
                    replaced = self.superseded.get(r["id"])
                    if replaced is not None and r["status"] in ("queued", "processing"):
                        # Being re-derived: the previous derivative is still the card's.
                        assert r["derived_key"] == derived_key(Attempt(r["id"], replaced))

    return LeaseProtocol


def test_lease_protocol_state_machine(db_url: str) -> None:
    machine = make_machine(db_url)
    machine.TestCase.settings = settings(
        max_examples=examples(60), stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()
