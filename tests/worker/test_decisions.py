"""The worker's decisions, in-process, against a scripted queue, store and decoder.

The worker knows the queue only as `worker.WorkerQueue`; here a scripted one hands out
leases and answers as the database would, and logs every call in order. The store is a
real local store whose requests can be made to fail or stall, and the decoder a stand-in
that answers, hangs or times out as told (by the lease's owner). Each test runs in well
under a second: the real PostgreSQL, store and decoder fleets stay in the slow lane
(test_worker.py, test_faults.py, test_outages.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from darkroom.card import Status
from darkroom.completer import Completer, running
from darkroom.config import Settings
from darkroom.derive import Derivative
from darkroom.errors import DeriveError, ErrorCode, StorageUnavailable
from darkroom.layout import CANARY, derived_key, original_key
from darkroom.queue import PAUSED_NOTICE, Derived, Lease
from darkroom.sandbox import Cancelled, DecoderProcess
from darkroom.storage.base import Body
from darkroom.storage.local import LocalStore
from darkroom.worker import Worker, WorkerQueue

# How long any awaited state may take to come (each comes in milliseconds).
DEADLINE = 5.0


async def until(check: Callable[[], object], what: str) -> None:
    """Until `check` answers something truthy, or fail at the deadline."""
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def outcomes(outcome: str) -> float:
    """How many attempts this process's workers ended with `outcome` (darkroom_jobs_total)."""
    return REGISTRY.get_sample_value("darkroom_jobs_total", {"outcome": outcome}) or 0.0


class ScriptedQueue:
    """The worker's queue, scripted: leases waiting to be claimed, tokens whose lease is
    lost (at the heartbeat, at the commit), and every call logged in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.waiting: list[Lease] = []
        self.lost_at_heartbeat: set[uuid.UUID] = set()
        self.lost_at_commit: set[uuid.UUID] = set()
        # While cleared, a commit waits (a batch in flight).
        self.commit_gate = asyncio.Event()
        self.commit_gate.set()
        self.batches: list[list[uuid.UUID]] = []
        self.failed: list[tuple[uuid.UUID, ErrorCode]] = []
        self.deferred: list[tuple[uuid.UUID, ErrorCode]] = []
        self.released: list[uuid.UUID] = []
        self.notices: asyncio.Queue[str] = asyncio.Queue()
        # While cleared, a hand-back waits (as behind a commit's row locks).
        self.release_gate = asyncio.Event()
        self.release_gate.set()
        self.unstarted: list[uuid.UUID] = []
        self.tracked: list[tuple[uuid.UUID, list[str]]] = []

    async def claim(self, n: int) -> list[Lease]:
        self.log.append("claim")
        taken, self.waiting = self.waiting[:n], self.waiting[n:]
        return taken

    async def adopt_claim(self, claim_id: uuid.UUID) -> list[Lease]:
        return []

    async def heartbeat(self, leases: Sequence[Lease]) -> set[uuid.UUID]:
        return {lease.token for lease in leases if lease.token in self.lost_at_heartbeat}

    async def track_attempt_objects(self, lease: Lease, keys: Sequence[str]) -> None:
        self.tracked.append((lease.token, list(keys)))

    async def complete_many(self, results: Sequence[tuple[Lease, Derived]]) -> set[uuid.UUID]:
        self.batches.append([lease.token for lease, _ in results])
        self.log.append(f"complete {len(results)}")
        await self.commit_gate.wait()
        return {lease.token for lease, _ in results if lease.token in self.lost_at_commit}

    async def complete_and_claim(self, results: Sequence[tuple[Lease, Derived]], n: int,
                                 claim_id: uuid.UUID | None = None, *,
                                 claimed: Callable[[list[Lease]], None] | None = None,
                                 ) -> tuple[set[uuid.UUID], list[Lease]]:
        lost = await self.complete_many(results)
        leases = await self.claim(n)
        if claimed is not None:
            claimed(leases)
        return lost, leases

    async def fail(self, lease: Lease, code: ErrorCode) -> Status:
        self.log.append(f"fail {code}")
        self.failed.append((lease.token, code))
        return Status.QUEUED

    async def defer(self, lease: Lease, code: ErrorCode, delay: float) -> None:
        self.log.append(f"defer {code}")
        self.deferred.append((lease.token, code))

    async def defer_counted(self, lease: Lease, code: ErrorCode) -> tuple[Status, int]:
        self.log.append(f"defer_counted {code}")
        self.deferred.append((lease.token, code))
        return Status.QUEUED, 1

    async def release(self, leases: Sequence[Lease],
                      unstarted: Collection[uuid.UUID] = ()) -> set[uuid.UUID]:
        self.log.append(f"release {len(leases)}")
        await self.release_gate.wait()
        self.released += [lease.token for lease in leases]
        self.unstarted += list(unstarted)
        return {lease.file_id for lease in leases}

    async def pause_worker(self, reason: str) -> None:
        self.log.append("pause_worker")

    async def resume_worker(self) -> None:
        self.log.append("resume_worker")

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[AsyncIterator[str]]:
        async def notified() -> AsyncIterator[str]:
            while True:  # what `notify` sends; nothing else: the worker polls
                yield await self.notices.get()

        yield notified()

    def notify(self, payload: str) -> None:
        """A NOTIFY on the workers' channel."""
        self.notices.put_nowait(payload)


class ScriptedStore(LocalStore):
    """A real local store whose requests fail (an outage) or stall (a store that stopped
    answering) on demand. The canary probe's requests are logged as `probe`."""

    def __init__(self, root: Path, log: list[str]) -> None:
        super().__init__(root)
        self.log = log
        self.failing = False
        self.stall_reads = False
        self.stall_writes = False
        self.unstall = threading.Event()

    def _request(self, key: str, op: str) -> None:
        kind = "probe" if key.startswith(CANARY) else op
        if self.failing:
            if op == "put" or kind != "probe":
                self.log.append(f"{kind} failed")
            raise StorageUnavailable("scripted outage")
        if (self.stall_reads and kind == "get") or (self.stall_writes and kind == "put"):
            self.log.append(f"{kind} stalled")
            self.unstall.wait(DEADLINE)
        if op == "put" or kind != "probe":
            self.log.append(kind)

    def get(self, key: str, version: str) -> bytes:
        self._request(key, "get")
        return super().get(key, version)

    def put(self, key: str, body: Body, *, content_type: str = "application/octet-stream"
            ) -> str:
        self._request(key, "put")
        return super().put(key, body, content_type=content_type)


class Script:
    """What the decoder does, by the lease's owner: `ok` answers at once, `hang` until it
    is killed or let go (`finish`), `limit` fails as the child's own time limit does."""

    def __init__(self, **modes: str) -> None:
        self.modes = modes
        self.started: set[str] = set()
        self.finish: set[str] = set()
        self.killed = 0


class ScriptedDecoder(DecoderProcess):
    """A decoder slot without a child: it answers as the script says."""

    def __init__(self, script: Script) -> None:  # no child, no limits: nothing to start
        self.script = script
        self._kill = threading.Event()
        self.last_stages: dict[str, float] = {}

    @property
    def owner(self) -> str | None:
        return None

    def start(self) -> None:
        pass

    def close(self) -> None:
        self._kill.set()

    def kill(self) -> None:
        self.script.killed += 1
        self._kill.set()

    def derive(self, data: bytes, *, owner: str | None = None) -> Derivative:
        assert owner is not None
        self._kill.clear()
        self.script.started.add(owner)
        mode = self.script.modes[owner]
        if mode == "limit":
            raise DeriveError(ErrorCode.PROCESSING_TIMEOUT, "decode past its time limit")
        if mode == "hang":
            deadline = time.monotonic() + DEADLINE
            while owner not in self.script.finish:
                if self._kill.wait(0.005):
                    raise Cancelled()
                if time.monotonic() > deadline:
                    raise AssertionError("the decoder was never let go")
        return Derivative(data=b"RIFF-webp", width=1, height=1, sha256="0" * 64)


class Rig:
    """One worker on the scripted queue, store and decoder; `log` holds their calls in
    the order they came."""

    def __init__(self, tmp_path: Path, script: Script, *, slots: int = 1,
                 **settings: Any) -> None:
        self.log: list[str] = []
        self.queue = ScriptedQueue(self.log)
        self.store = ScriptedStore(tmp_path / "objects", self.log)
        self.script = script
        options: dict[str, Any] = {
            "data_dir": tmp_path, "poll_seconds": 0.05, "lease_seconds": 3.0,
            "retry_base_seconds": 0.0, "retry_cap_seconds": 0.1,
            "shutdown_grace_seconds": 0.2}
        options.update(settings)
        self.settings = Settings(**options)
        seam: WorkerQueue = self.queue
        self.worker = Worker(self.settings, seam, self.store, concurrency=slots)
        decoders: list[DecoderProcess] = [ScriptedDecoder(script) for _ in range(slots)]
        self.worker.idle_decoders = decoders

    def lease(self, owner: str) -> Lease:
        """A card of `owner` with its original stored, leased to this worker's next claim."""
        file_id = uuid.uuid4()
        key = original_key(file_id, owner)
        version = LocalStore.put(self.store, key, b"an original")
        lease = Lease(file_id=file_id, token=uuid.uuid4(), attempt=1,
                      lease_until=datetime.now(UTC), owner=owner, original_key=key,
                      original_version=version)
        self.queue.waiting.append(lease)
        return lease

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        task = asyncio.create_task(self.worker.run())
        try:
            yield task
        finally:
            self.store.failing = False
            self.store.unstall.set()
            self.script.finish.update(self.script.modes)
            self.queue.commit_gate.set()
            self.worker.request_stop()
            self.worker.request_stop()  # the second signal: no grace
            await asyncio.wait_for(task, DEADLINE)

    def after(self, entry: str) -> list[str]:
        """The log from the first `entry` on."""
        return self.log[self.log.index(entry):]


async def test_a_slot_starts_the_lease_kept_ahead_while_its_last_commit_is_on_its_way(
        tmp_path: Path) -> None:
    """One slot keeps one lease ahead: a job that hands its result over frees the slot, and
    the lease kept ahead starts at once while that commit is still on its way. A stop hands
    the lease kept ahead back as never started."""
    rig = Rig(tmp_path, Script(alice="ok", bob="ok", carol="hang", dave="ok"))
    a, b, c, d = (rig.lease(owner) for owner in ("alice", "bob", "carol", "dave"))
    rig.queue.commit_gate.clear()  # commits wait: a batch in flight
    async with rig.running():
        await until(lambda: "bob" in rig.script.started, "bob started")
        assert rig.log[:4] == ["claim", "get", "put", "complete 1"]  # alice's, unanswered
        assert rig.queue.batches == [[a.token]]
        rig.queue.commit_gate.set()
        await until(lambda: "carol" in rig.script.started and d.token in rig.worker.claimed_ahead,
                    "carol started, dave kept ahead")
        assert [a.token] in rig.queue.batches and [b.token] in rig.queue.batches
    assert rig.queue.unstarted == [d.token]
    assert sorted(rig.queue.released) == sorted([c.token, d.token])


async def test_a_pause_hands_back_the_leases_kept_ahead_unstarted(tmp_path: Path) -> None:
    """A pause comes while a slot decodes and a lease waits ahead of it: the lease kept
    ahead goes back at once, never started, its attempt given back; the claim, which
    passes over paused cards, decides what runs next."""
    rig = Rig(tmp_path, Script(alice="hang", bob="ok"))
    rig.lease("alice")
    bob = rig.lease("bob")
    async with rig.running():
        await until(lambda: bob.token in rig.worker.claimed_ahead, "bob kept ahead")
        rig.queue.notify(PAUSED_NOTICE)
        await until(lambda: rig.queue.unstarted, "bob handed back")
        assert rig.queue.unstarted == [bob.token] and not rig.worker.claimed_ahead
        rig.script.finish.add("alice")
        await until(lambda: rig.queue.batches, "alice committed")
    assert "bob" not in rig.script.started


async def test_an_open_store_breaker_hands_back_the_leases_kept_ahead(tmp_path: Path) -> None:
    """The store fails a slot's job while a lease waits ahead of it: once the breaker is
    open the lease kept ahead goes back unstarted, for workers that reach the store."""
    rig = Rig(tmp_path, Script(alice="ok", bob="ok"))
    rig.lease("alice")
    bob = rig.lease("bob")
    rig.store.failing = True
    async with rig.running():
        await until(lambda: rig.queue.unstarted, "bob handed back")
        assert rig.worker.breaker.is_open
        assert rig.queue.unstarted == [bob.token] and not rig.worker.claimed_ahead
    assert "bob" not in rig.script.started


async def test_a_lease_claimed_by_a_commit_that_answers_during_the_stop_goes_back(
        tmp_path: Path) -> None:
    """A commit's claim answered while the stop hands its unfinished job back (that
    hand-back waits, as behind the commit's row locks): the lease it brings goes back too,
    unstarted, before the worker ends."""
    rig = Rig(tmp_path, Script(alice="ok", bob="ok"), shutdown_grace_seconds=0.1)
    a = rig.lease("alice")
    rig.queue.commit_gate.clear()
    async with rig.running():
        await until(lambda: rig.queue.batches == [[a.token]], "alice's commit on its way")
        bob = rig.lease("bob")  # for the claim that goes with alice's commit
        rig.queue.release_gate.clear()
        rig.worker.request_stop()
        await until(lambda: "release 1" in rig.log, "alice handed back at the stop")
        rig.queue.commit_gate.set()
        await until(lambda: bob.token in rig.worker.claimed_ahead, "bob claimed meanwhile")
        rig.queue.release_gate.set()
    assert rig.queue.unstarted == [bob.token]
    assert "bob" not in rig.script.started


async def test_a_store_error_opens_the_breaker_and_claims_stop_until_a_probe_answers(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(alice="ok", bob="ok"))
    rig.store.failing = True
    first = rig.lease("alice")
    async with rig.running():
        await until(lambda: rig.queue.deferred, "the first card handed back")
        assert rig.queue.deferred == [(first.token, ErrorCode.STORAGE_UNAVAILABLE)]
        assert rig.worker.breaker.is_open
        # The job's read failed, then the probe: the card went back, its attempt given
        # back (not counted: the store served nothing since), and the pause is recorded.
        # (A claim may come between them: the lease kept ahead of the slot.)
        assert [e for e in rig.log[rig.log.index("get failed"):] if e != "claim"][:3] == [
            "get failed", "probe failed", "defer storage_unavailable"]
        await until(lambda: "pause_worker" in rig.log, "the pause recorded")
        second = rig.lease("bob")
        await until(lambda: rig.after("defer storage_unavailable").count("probe failed") >= 3,
                    "probes while the store is down")
        assert "claim" not in rig.after("defer storage_unavailable")
        assert rig.queue.waiting == [second]

        rig.store.failing = False
        await until(lambda: rig.queue.batches, "the second card committed")
        assert rig.queue.batches == [[second.token]]
        back = rig.after("defer storage_unavailable")
        # The first probe that answered came before any claim; then the card was read,
        # stored and committed.
        assert back.index("probe") < back.index("claim") < back.index("get") < back.index(
            "complete 1")
        await until(lambda: "resume_worker" in rig.log, "the resume recorded")
        assert not rig.worker.breaker.is_open
    assert rig.queue.failed == []


async def test_a_store_that_stops_answering_defers_and_never_fails_the_file(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(alice="ok"), attempt_timeout_seconds=0.4)
    rig.store.stall_reads = True
    lease = rig.lease("alice")
    timeouts = REGISTRY.get_sample_value("darkroom_attempt_timeouts_total") or 0.0
    async with rig.running():
        await until(lambda: rig.queue.deferred, "the card handed back")
        # Deferred at the attempt's deadline while it waited on the store: the store's
        # fault, so the attempt is given back and the breaker opens without a probe.
        assert rig.queue.deferred == [(lease.token, ErrorCode.STORAGE_UNAVAILABLE)]
        assert rig.worker.breaker.reason == "timeout"
        assert REGISTRY.get_sample_value("darkroom_attempt_timeouts_total") == timeouts + 1
    assert rig.queue.failed == []
    assert rig.script.started == set()  # never reached the decoder


async def test_a_write_that_lands_after_its_attempt_gave_up_is_tracked_anew(
        tmp_path: Path) -> None:
    """A stalled PUT outlives its attempt (deferred at the deadline); when it returns,
    the attempt's object is tracked again, so the sweeper finds a write that landed after
    it had dropped the first row."""
    rig = Rig(tmp_path, Script(alice="ok"), attempt_timeout_seconds=0.4)
    rig.store.stall_writes = True
    lease = rig.lease("alice")
    async with rig.running():
        await until(lambda: rig.queue.deferred, "the card handed back")
        assert rig.queue.tracked == []
        rig.store.unstall.set()
        await until(lambda: rig.queue.tracked, "the late write tracked")
    assert rig.queue.tracked == [(lease.token, [derived_key(lease)])]
    assert rig.queue.deferred == [(lease.token, ErrorCode.STORAGE_UNAVAILABLE)]


async def test_a_stop_waits_for_a_stalled_write_no_longer_than_the_grace(
        tmp_path: Path) -> None:
    """A PUT that never returns is waited for (to track its object) only within the
    shutdown grace, not a lease: the object, if the store ever lands it, is reconcile's."""
    rig = Rig(tmp_path, Script(alice="ok"), attempt_timeout_seconds=0.4, lease_seconds=60.0)
    rig.store.stall_writes = True
    rig.lease("alice")
    task = asyncio.create_task(rig.worker.run())
    try:
        await until(lambda: rig.queue.deferred, "the card handed back")
        rig.worker.request_stop()
        await asyncio.wait_for(asyncio.shield(task), DEADLINE)
        assert rig.queue.tracked == []
    finally:
        rig.store.unstall.set()
        rig.worker.request_stop()
        await asyncio.wait_for(task, 60)


@pytest.mark.parametrize("mode", ["hang", "limit"])
async def test_a_decode_out_of_time_fails_the_file_processing_timeout(
        tmp_path: Path, mode: str) -> None:
    """`hang`: the attempt's deadline passes in the decoder; `limit`: the child's own time
    limit. Either way it is the file's: failed (transient), never deferred."""
    rig = Rig(tmp_path, Script(alice=mode), attempt_timeout_seconds=0.4)
    lease = rig.lease("alice")
    async with rig.running():
        await until(lambda: rig.queue.failed, "the failure recorded")
        assert rig.queue.failed == [(lease.token, ErrorCode.PROCESSING_TIMEOUT)]
        if mode == "hang":
            assert rig.script.killed == 1  # the child is killed, not left to run on
    assert rig.queue.deferred == [] and rig.queue.batches == []
    assert not rig.worker.breaker.is_open


async def test_at_shutdown_jobs_finish_within_the_grace_and_the_rest_are_handed_back(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(quick="hang", slow="hang"), slots=2,
              shutdown_grace_seconds=0.3)
    quick, slow = rig.lease("quick"), rig.lease("slow")
    released = outcomes("released")
    run = asyncio.create_task(rig.worker.run())
    try:
        await until(lambda: rig.script.started == {"quick", "slow"}, "both jobs decoding")
        rig.worker.request_stop()
        rig.script.finish.add("quick")  # finishes within the grace
        await asyncio.wait_for(run, DEADLINE)
    finally:
        rig.script.finish.add("slow")
        rig.worker.request_stop()
        await asyncio.wait_for(run, DEADLINE)
    assert rig.queue.batches == [[quick.token]]
    assert rig.queue.released == [slow.token]
    after_stop = rig.after("complete 1")
    assert after_stop == ["complete 1", "release 1"]  # no claim once stopping
    assert rig.queue.failed == [] and rig.queue.deferred == []
    assert outcomes("released") == released + 1


async def test_a_second_signal_hands_back_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(alice="hang"), shutdown_grace_seconds=60)
    lease = rig.lease("alice")
    run = asyncio.create_task(rig.worker.run())
    try:
        await until(lambda: rig.script.started, "the job decoding")
        rig.worker.request_stop()
        rig.worker.request_stop()
        # Well inside the 60 s grace: the second signal skipped it.
        await asyncio.wait_for(run, DEADLINE)
    finally:
        rig.script.finish.add("alice")
        await asyncio.wait_for(run, DEADLINE)
    assert rig.queue.released == [lease.token]


async def test_the_completer_batches_what_finishes_while_a_commit_is_in_flight() -> None:
    log: list[str] = []
    queue = ScriptedQueue(log)
    derived = Derived(key="k", version="v", sha256="0" * 64, width=1, height=1, size=1)

    def lease() -> Lease:
        return Lease(file_id=uuid.uuid4(), token=uuid.uuid4(), attempt=1,
                     lease_until=datetime.now(UTC), owner="o", original_key="k",
                     original_version="v")

    async def once(call: Callable[[], Awaitable[set[uuid.UUID]]],
                   leases: Sequence[Lease]) -> set[uuid.UUID]:
        return await call()

    first, *rest = [lease() for _ in range(4)]
    queue.lost_at_commit = {rest[1].token}
    queue.commit_gate.clear()
    async with running(Completer(queue, once)) as completer:
        answers = [completer.submit(first, derived)]
        await until(lambda: queue.batches, "the first commit in flight")
        answers += [completer.submit(x, derived) for x in rest]
        queue.commit_gate.set()
        published = await asyncio.wait_for(asyncio.gather(*answers), DEADLINE)
    # One statement for the first, one for the three that finished while it was in flight;
    # each row fenced by its own token: the lost one alone answers False.
    assert queue.batches == [[first.token], [x.token for x in rest]]
    assert published == [True, True, False, True]


async def test_a_commit_whose_lease_was_lost_ends_lease_lost(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(alice="ok"))
    lease = rig.lease("alice")
    rig.queue.lost_at_commit = {lease.token}
    lost = outcomes("lease_lost")
    async with rig.running():
        await until(lambda: outcomes("lease_lost") > lost, "the attempt ended")
    assert outcomes("lease_lost") == lost + 1
    assert rig.queue.batches == [[lease.token]]
    # Nothing more is recorded for the card: the lease's next holder owns it now.
    assert rig.queue.failed == [] and rig.queue.deferred == [] and rig.queue.released == []


async def test_a_lease_lost_at_the_heartbeat_abandons_the_job(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Script(alice="hang"), lease_seconds=0.3)  # a heartbeat each 0.1 s
    lease = rig.lease("alice")
    lost = outcomes("lease_lost")
    async with rig.running():
        await until(lambda: rig.script.started, "the job decoding")
        rig.queue.lost_at_heartbeat.add(lease.token)
        await until(lambda: outcomes("lease_lost") > lost, "the job abandoned")
        assert rig.script.killed == 1  # its child killed at once, not left to finish
        assert rig.worker.jobs == {}
    assert rig.queue.batches == []
    assert rig.queue.failed == [] and rig.queue.deferred == [] and rig.queue.released == []
