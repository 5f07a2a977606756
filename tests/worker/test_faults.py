"""Faults at the network, between real processes and real servers.

A worker process reaches PostgreSQL or the S3 server through a `FaultProxy` that cuts its
connections, before a statement reaches the server or after the server answered (the
statement committed, its sender sees an error), or stalls, resets and refuses the store.
The API and the sweeper are connected normally. Every run checks, from the database, the
bucket and the API: every card final, every ready card's derivative served with its sha256,
no attempt above the maximum, none spent on a lost answer, nothing left that no card
accounts for after reconciliation.
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.faults import FaultProxy, through_proxy
from tests.support.services import DarkroomProcess, Harness, free_port, small_photos, wait_for
from tests.support.sql import SQL

# A fleet of real processes: not in `make test-fast`.
pytestmark = pytest.mark.fleet

FILES = 200




def started(proc: DarkroomProcess) -> bool:
    assert proc.proc.poll() is None, proc.log()
    return "worker started" in proc.log()


class Api:
    """A real API process of the harness, and a key for its owner."""

    def __init__(self, h: Harness) -> None:
        port = free_port()
        key = subprocess.run([sys.executable, "-m", "darkroom.cli", "keys", "create",
                              "--owner", "tester"], env=h.env, capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip().split()[-1]
        self.proc = h.start("api", "--port", str(port))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                   headers={"Authorization": f"Bearer {key}"},
                                   follow_redirects=True)
        wait_for(self._up, timeout=60, what="the API")

    def _up(self) -> bool:
        assert self.proc.proc.poll() is None, self.proc.log()
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def derivative_sha256(self, file_id: uuid.UUID) -> str:
        answer = self.client.get(f"/v1/files/{file_id}/derivative")
        assert answer.status_code == 200, (file_id, answer.status_code)
        return hashlib.sha256(answer.content).hexdigest()


@pytest.fixture
def api(harness: Harness) -> Iterator[Api]:
    a = Api(harness)
    try:
        yield a
    finally:
        a.client.close()


def check_everything(h: Harness, api: Api, ids: list[uuid.UUID]) -> None:
    wait_for(lambda: h.all_finished(ids), timeout=600, what="every card final")
    assert h.statuses(ids) == {"ready": len(ids)}
    cards = {c["id"]: c for c in h.db.execute(SQL["cards_among"], {"ids": ids}).fetchall()}
    for file_id in ids:
        h.assert_published_once(file_id)
        assert api.derivative_sha256(file_id) == cards[file_id]["sha256"]
    assert max(c["attempts"] for c in cards.values()) <= 3
    # Attempts cut short by a fault leave orphans: one sweep takes them all
    # (guard 0 here), and reconciliation finds nothing else.
    sweep = subprocess.run([sys.executable, "-m", "darkroom.cli", "sweep", "--once"],
                           env=h.env, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stderr
    reconcile = subprocess.run([sys.executable, "-m", "darkroom.cli", "reconcile"],
                               env=h.env, capture_output=True, text=True, timeout=300)
    assert reconcile.returncode == 0, reconcile.stderr
    assert reconcile.stdout.strip().endswith("deleted: 0"), reconcile.stdout
    unaccounted = h.db.execute(SQL["orphan_count"]).fetchone()
    assert unaccounted == {"n": 0}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before", "after"])
def test_cut_database_connections_lose_nothing(harness: Harness, api: Api, where: str) -> None:
    """(a) statements cut before they reach the server; (b) committed, answer cut."""
    proxy, url = through_proxy(harness.db_url, seed=11 if where == "before" else 12)
    try:
        ids = harness.upload_many(small_photos(FILES))
        worker = harness.worker(concurrency=2, database_url=url, lease_seconds="4")
        wait_for(lambda: started(worker), timeout=120, what="the worker")
        harness.start("sweep", env={"DARKROOM_SWEEP_INTERVAL_SECONDS": "0.2"})
        proxy.set_cuts(**{where: 0.08})
        wait_for(lambda: harness.all_finished(ids), timeout=600, what="every card final")
        proxy.set_cuts()
        cuts = proxy.counters.cut_before if where == "before" else proxy.counters.cut_after
        assert cuts >= 10, proxy.counters
        check_everything(harness, api, ids)
        attempts = harness.db.execute(SQL["attempts_histogram"]).fetchall()
        # No attempt was spent on a lost answer: every file was started exactly once.
        assert attempts == [{"attempts": 1, "n": FILES}], (attempts, proxy.counters)
        lost = harness.events(kind="lease_lost")
        assert lost == [], [(e["kind"], e["token"], e["worker"], e["created_at"].time())
                             for x in lost for e in harness.events(x["file_id"])]
        assert "Traceback" not in worker.log()
    finally:
        proxy.close()


def seaweed_proxy(seaweed: Any) -> tuple[FaultProxy, dict[str, str]]:
    host, port = seaweed.endpoint_url.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)))
    return proxy, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stall", "reset", "refuse"])
def test_a_store_outage_rejects_nothing_and_pauses_claims(harness: Harness, api: Api,
                                                          seaweed: Any, fault: str) -> None:
    """An outage of the store longer than the whole backoff schedule spends no attempt."""
    proxy, env = seaweed_proxy(seaweed)
    # A stalled request is the store's failure after 2 × 1 s, not 2 × the default 10 s.
    env["DARKROOM_STORAGE_TIMEOUT_SECONDS"] = "1"
    try:
        ids = harness.upload_many(small_photos(FILES))
        worker = harness.start("worker", "--concurrency", "2", "--name", "wf", env=env)
        wait_for(lambda: started(worker), timeout=120, what="the worker")
        wait_for(lambda: harness.statuses(ids).get("ready", 0) >= 20, timeout=300,
                 what="progress before the outage")
        getattr(proxy, fault)()
        wait_for(lambda: harness.value("worker_paused", {"worker": "wf"}),
                 timeout=120, what="the worker to pause")
        assert "object store failing" in worker.log()
        # The outage lasts past the whole retry schedule (base 0.2 s, cap 1 s, 3 attempts),
        # in which every claimed card would have been rejected without the breaker: until
        # the worker's pause, as the database sees it, has lasted 5 s.
        wait_for(lambda: harness.value("worker_paused_long", {"worker": "wf", "seconds": 5}),
                 timeout=120, what="a long outage")
        before = harness.statuses(ids)
        proxy.heal()
        wait_for(lambda: harness.value("worker_pause_count") == 0,
                 timeout=120, what="the worker to resume")
        check_everything(harness, api, ids)
        assert "rejected" not in before
        assert "answers again" in worker.log()
    finally:
        proxy.close()


def test_an_attempt_outliving_its_timeout_goes_back_to_the_queue(
        harness: Harness, tmp_path: Path) -> None:
    """A decode that hangs past DARKROOM_ATTEMPT_TIMEOUT_SECONDS (its own derive timeout
    is far longer) is given up: transient, retried, then rejected with that code."""
    [file_id] = harness.upload_many(small_photos(1))
    marker = tmp_path / "hang"
    harness.worker(concurrency=1, child=("hang", str(marker)), attempt_timeout_seconds="2",
                   derive_timeout_seconds="600", lease_seconds="60")
    wait_for(lambda: harness.card(file_id)["status"] == "rejected", timeout=120,
             what="every attempt timed out")
    card = harness.card(file_id)
    assert card["error_code"] == "processing_timeout" and card["attempts"] == 3
    kinds = [e["kind"] for e in harness.events(file_id)]
    assert kinds == ["claimed", "retry_scheduled"] * 2 + ["claimed", "exhausted"]


def hanging_worker(harness: Harness, tmp_path: Path, url: str, *, cards: int
                   ) -> tuple[list[uuid.UUID], DarkroomProcess]:
    """`cards` uploaded and leased by a worker of 2 slots (a grace of 1 s) reaching the
    database at `url`, whose decoder children hang."""
    ids = harness.upload_many(small_photos(cards))
    w = harness.worker(concurrency=2, database_url=url, child=("hang", str(tmp_path / "hang")),
                       shutdown_grace_seconds="1")
    wait_for(lambda: harness.statuses(ids).get("processing", 0) == cards,
             what=f"{cards} leases")
    return ids, w


def test_sigterm_with_the_database_unreachable_still_ends(harness: Harness,
                                                         tmp_path: Path) -> None:
    """The stop is bounded even when nothing can be handed back: the leases expire."""
    proxy, url = through_proxy(harness.db_url, seed=3)
    try:
        ids, w = hanging_worker(harness, tmp_path, url, cards=2)
        proxy.stall()
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert "could not hand leases back" in w.log()
        assert harness.statuses(ids) == {"processing": 2}
    finally:
        proxy.close()


def test_sigterm_with_a_claim_the_database_never_answers_still_ends(harness: Harness,
                                                                   tmp_path: Path) -> None:
    """A claim on its way when the database froze (its connection open, nothing coming
    back) does not hold the stop: it is given up, and what it may have leased expires."""
    proxy, url = through_proxy(harness.db_url, seed=4)
    try:
        ids, w = hanging_worker(harness, tmp_path, url, cards=2)
        # Both slots are busy, so the next card is claimed ahead: that claim freezes.
        proxy.stall_at(b"expired AS (")
        [late] = harness.upload_many(small_photos(1))
        wait_for(lambda: not proxy.statement_cut_pending, what="the claim held")
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert harness.statuses([*ids, late]) == {"processing": 2, "queued": 1}
    finally:
        proxy.close()


def test_a_hand_back_cut_once_is_sent_again(harness: Harness, tmp_path: Path) -> None:
    """The stop's hand-back loses its connection once, before it reached the database: it
    is sent again within its bound, so the cards go back at once and the leases kept
    ahead of the slots keep their attempt (found by attack: tried once, they waited out
    their lease, and their attempt counted)."""
    proxy, url = through_proxy(harness.db_url, seed=5)
    try:
        # Two decoding, two kept ahead of the slots.
        ids, w = hanging_worker(harness, tmp_path, url, cards=4)
        wait_for(lambda: w.log().count("hostile: hanging") == 2, what="2 decoding")
        proxy.cut_statement(b"released AS (", where="before")
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert not proxy.statement_cut_pending
        assert harness.statuses(ids) == {"queued": 4}
        attempts = sorted(harness.card(i)["attempts"] for i in ids)
        assert attempts == [0, 0, 1, 1]
    finally:
        proxy.close()


def test_a_claim_that_answers_during_the_stop_starts_nothing(harness: Harness,
                                                            tmp_path: Path) -> None:
    """A claim on its way when the stop came answers during the stop: what it leased is
    handed back unstarted, its attempt given back, not started and then handed back
    (found by attack)."""
    proxy, url = through_proxy(harness.db_url, seed=6)
    try:
        [first] = harness.upload_many(small_photos(1))
        marker = tmp_path / "hang"
        w = harness.worker(concurrency=2, database_url=url, child=("hang", str(marker)),
                           shutdown_grace_seconds="30")
        wait_for(lambda: "hostile: hanging" in w.log(), what="the first card decoding")
        proxy.stall_at(b"expired AS (")
        [late] = harness.upload_many(small_photos(1))
        wait_for(lambda: not proxy.statement_cut_pending, what="the claim held")
        w.signal(signal.SIGTERM)
        wait_for(lambda: "stopping: no new claims" in w.log(), what="the stop")
        proxy.heal()
        wait_for(lambda: [e["kind"] for e in harness.events(late)] == ["claimed", "released"],
                 what="the late card handed back")
        w.signal(signal.SIGTERM)  # no need to wait out the first card's grace
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert harness.card(late)["attempts"] == 0
        assert w.log().count("hostile: hanging") == 1
        assert harness.card(first)["status"] == "queued"
    finally:
        proxy.close()


def test_a_signal_while_the_worker_starts_ends_it(harness: Harness) -> None:
    """SIGTERM while the worker still waits for its database at start: it stops there,
    exit 0, nothing claimed (found by attack: the signal killed it)."""
    proxy, url = through_proxy(harness.db_url, seed=7)
    try:
        [card] = harness.upload_many(small_photos(1))
        proxy.stall()
        w = harness.worker(concurrency=1, database_url=url)
        wait_for(lambda: proxy.counters.connections >= 1,
                 what="the worker to reach for its database")
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert "stopped before the worker started" in w.log()
        assert harness.card(card)["status"] == "queued"
    finally:
        proxy.close()


def test_signals_while_the_stopped_worker_exits_change_nothing(harness: Harness) -> None:
    """Once its stop is done ("worker stopped"), signals sent while the process ends (a
    storm of them, as an impatient supervisor sends) leave its exit 0 (found by attack:
    closing the loop, then the interpreter's shutdown, put the default handlers back, and
    a signal in those moments killed it)."""
    w = harness.worker(concurrency=1)
    wait_for(lambda: started(w), timeout=120, what="the worker")
    w.signal(signal.SIGTERM)
    wait_for(lambda: "worker stopped" in w.log(), interval=0.002, what="the stop")
    sent = 0
    while w.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            w.signal(signal.SIGTERM if sent % 2 else signal.SIGINT)
            sent += 1
        time.sleep(0.001)  # the storm's pace, not a wait for a state
    assert w.wait(timeout=60) == 0, (sent, w.log()[-2000:])


def test_a_second_signal_as_the_worker_exits_changes_nothing(harness: Harness,
                                                             seaweed: Any) -> None:
    """With downloads blocked on a frozen store, a second SIGINT lands after the stop,
    while the process exits: the exit is still 0 and does not wait for the blocked
    downloads (found by attack: the loop's handlers were gone, so the signal raised
    KeyboardInterrupt, or killed the process)."""
    proxy, env = seaweed_proxy(seaweed)
    try:
        w = harness.start("worker", "--concurrency", "2", "--name", "ws",
                          env={**env, "DARKROOM_SHUTDOWN_GRACE_SECONDS": "1"})
        wait_for(lambda: started(w), timeout=120, what="the worker")
        proxy.stall()
        ids = harness.upload_many(small_photos(2))
        wait_for(lambda: harness.statuses(ids).get("processing", 0) == 2, what="2 leases")
        w.signal(signal.SIGINT)
        wait_for(lambda: "worker stopped" in w.log(), interval=0.005, what="the stop")
        with contextlib.suppress(ProcessLookupError):
            w.signal(signal.SIGINT)
        assert w.wait(timeout=60) == 0  # a deadline, not a measurement
        assert "exiting without waiting for calls that did not answer" in w.log()
        assert harness.statuses(ids) == {"queued": 2}
    finally:
        proxy.close()
