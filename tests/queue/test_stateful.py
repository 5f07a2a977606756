"""A Hypothesis state machine drives several simulated workers against the real queue.

The clock is controlled by moving a lease's `lease_until` into the past ("expire"), so
every interleaving of claim, heartbeat, commit, failure, expiry, release and revoke that
Hypothesis finds is checked against the protocol's invariants after every step. Unknown
outcomes are rules too: a statement repeated after it committed (its answer lost) must be
recognized as the same success, and a claim whose answer was lost is adopted. Commits
come one by one and in batches; the sweeper's orphan unit and reconciliation run between
any two steps against a real local store, and no object a card references may ever go.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from psycopg.rows import dict_row

from darkroom.db.connection import open_pool
from darkroom.db.queries import QUERIES
from darkroom.errors import ErrorCode
from darkroom.queue import Derived, Lease, LeaseLost, Queue, derived_key
from darkroom.storage import open_store
from darkroom.sweeper import Database, Orphans, Reconcile

MAX_ATTEMPTS = 3
WORKERS = 3


def make_machine(db_url: str) -> type[RuleBasedStateMachine]:
    class LeaseProtocol(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.db = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
            self.db.execute("TRUNCATE archive_files, archive_events, orphan_objects,"
                            " maintenance_schedule CASCADE")
            self.objects = Path(tempfile.mkdtemp(prefix="darkroom-stateful-"))
            self.store = open_store(self.objects.as_uri())
            self.pool = self.run(open_pool(db_url, min_size=1, max_size=2))
            self.queues = [
                Queue(self.pool, lease_seconds=60, max_attempts=MAX_ATTEMPTS,
                      retry_base_seconds=0, retry_cap_seconds=0, worker=f"w{i}")
                for i in range(WORKERS)
            ]
            self.held: list[list[Lease]] = [[] for _ in range(WORKERS)]
            self.files: list[uuid.UUID] = []
            self.published: dict[uuid.UUID, uuid.UUID] = {}  # file -> token that published
            self.starts: dict[uuid.UUID, int] = {}
            self.derived: dict[uuid.UUID, Derived] = {}
            # Statements that went through, to be repeated as if their answer was lost.
            self.finished: list[tuple[int, Lease, str, ErrorCode | None]] = []

        def run(self, coro: Any) -> Any:
            return self.loop.run_until_complete(coro)

        def teardown(self) -> None:
            self.run(self.pool.close())
            self.loop.close()
            self.db.close()
            shutil.rmtree(self.objects, ignore_errors=True)

        def derive(self, w: int, lease: Lease) -> Derived:
            """What an attempt does before its commit: register its key, then PUT."""
            key = derived_key(lease)
            self.run(self.queues[w].register_attempt_object(lease, key))
            version = self.store.put(key, b"webp")
            return Derived(key, version, "0" * 64, 1, 1, 4)

        def row(self, file_id: uuid.UUID) -> dict[str, Any]:
            found = self.db.execute("SELECT * FROM archive_files WHERE id = %s",
                                    (file_id,)).fetchone()
            assert found is not None
            return found

        def holds_lease(self, lease: Lease) -> bool:
            r = self.row(lease.file_id)
            return r["status"] == "processing" and r["lease_token"] == lease.token

        @rule()
        def add_file(self) -> None:
            card = self.run(self.queues[0].create_file(
                owner="o", filename="x.jpg", content_type="image/jpeg", size=1))
            self.run(self.queues[0].confirm(card["id"], "o", "v1"))
            self.files.append(card["id"])

        @rule(w=st.integers(0, WORKERS - 1), n=st.integers(1, 4))
        def claim(self, w: int, n: int) -> None:
            leases = self.run(self.queues[w].claim(n))
            for lease in leases:
                self.starts[lease.file_id] = self.starts.get(lease.file_id, 0) + 1
                assert lease.attempt == self.starts[lease.file_id]
            self.held[w].extend(leases)

        @rule()
        def claim_pass(self) -> None:
            """A rescuer claims everything claimable: no expired lease survives it."""
            self.claim(0, 1000)
            stuck = self.db.execute(
                "SELECT count(*) AS n FROM archive_files"
                " WHERE status = 'processing' AND lease_until < now()").fetchone()
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
            assert status in {"queued", "rejected"}
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
            if kind == "complete":
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
                    self.finished.append((w, lease, "complete", None))

        @rule()
        def sweep(self) -> None:
            """The orphan unit and reconciliation, between any two steps (guard 0)."""
            db = Database(self.queues[0])
            while self.run(Orphans(db, self.store, guard_seconds=0).run_once()):
                pass
            self.run(Reconcile(db, self.store, guard_seconds=0).run(dry_run=False))

        @rule(w=st.integers(0, WORKERS - 1), n=st.integers(1, 4))
        def claim_answer_lost(self, w: int, n: int) -> None:
            """The claim commits, its answer never arrives; the worker adopts by claim id."""
            claim_id = uuid.uuid4()
            self.db.execute(QUERIES["claim"], {
                "n": n, "max_attempts": MAX_ATTEMPTS, "claim": claim_id,
                "lease_seconds": 60, "worker": f"w{w}"})
            leases = self.run(self.queues[w].adopt_claim(claim_id))
            for lease in leases:
                self.starts[lease.file_id] = self.starts.get(lease.file_id, 0) + 1
                assert lease.attempt == self.starts[lease.file_id]
            self.held[w].extend(leases)

        def lease_lost_count(self) -> int:
            found = self.db.execute("SELECT count(*) AS n FROM archive_events"
                                    " WHERE kind = 'lease_lost'").fetchone()
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
            self.db.execute("UPDATE archive_files SET lease_until = now() - interval '1 s'"
                            " WHERE id = %s AND status = 'processing'", (file_id,))

        @precondition(lambda self: bool(self.files))
        @rule(data=st.data())
        def revoke(self, data: st.DataObject) -> None:
            self.run(self.queues[0].revoke(data.draw(st.sampled_from(self.files)), "o"))

        @invariant()
        def protocol_holds(self) -> None:
            rows = self.db.execute("SELECT * FROM archive_files").fetchall()
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
                    assert r["derived_key"] == f"derived/{r['id']}/{token}.webp"
                    # The sweeper never takes what a card shows.
                    assert self.store.get(r["derived_key"], r["derived_version"]) == b"webp"
                elif r["status"] != "deleting":
                    assert r["id"] not in self.published

    return LeaseProtocol


def test_lease_protocol_state_machine(db_url: str) -> None:
    machine = make_machine(db_url)
    machine.TestCase.settings = settings(
        max_examples=40, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()
