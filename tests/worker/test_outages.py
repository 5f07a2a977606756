"""Store outages are never a file's fault; a file the store fails alone is, within a bound.

A real SeaweedFS whose volume server (the bytes) runs as a process of its own, and a real
worker process reaching it directly or through a `FaultProxy`. Each outage — the data
servers down while the S3 front answers, the whole store frozen (SIGSTOP), the store
answering every request 503 SlowDown — is held past the whole retry schedule (attempts,
backoff, lease) with 100 files waiting: none is rejected, none is started more than
DARKROOM_MAX_ATTEMPTS times, every one is ready after, and the worker's pause shows in
`darkroom stats`, `/v1/queue` and both sets of metrics while it lasts. A file whose own
requests the store fails while it serves the others is rejected `storage_unavailable` after
DARKROOM_MAX_DEFERRALS counted deferrals, without pausing the worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from darkroom.layout import original_key
from darkroom.storage import open_store
from tests.support.faults import FaultProxy
from tests.support.seaweed import SeaweedServer
from tests.support.services import Harness, free_port, small_photos, wait_for
from tests.support.sql import SQL

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

FILES = 100  # waiting when the outage begins
BEFORE = 5  # ready before it
# More finish while the fault is being set up (a store takes a moment to go down): these
# spare files keep at least FILES waiting when it is down.
SPARE = 10
WORKER = "wo"
# Small, so that an outage of seconds outlasts the whole schedule: 3 attempts, backoff
# 0.2 s doubling to 1 s (the harness's), a 2 s lease, 4 s for an attempt.
ATTEMPT_SECONDS = 4
SETTINGS = {"DARKROOM_ATTEMPT_TIMEOUT_SECONDS": str(ATTEMPT_SECONDS)}
# The outage lasts until the worker's pause, as the database records it, has lasted this
# long: past every attempt of a card, each running into its time limit on a stalled
# store, and every backoff between them.
HELD_SECONDS = 3 * ATTEMPT_SECONDS + 1


@pytest.fixture(scope="module")
def split_seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer.start(tmp_path_factory.mktemp("s3split"), split_volume=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store_harness(db_url: str, split_seaweed: SeaweedServer, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    for name, value in split_seaweed.env().items():
        monkeypatch.setenv(name, value)
    bucket = split_seaweed.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
    url = f"s3://{bucket}/darkroom"
    h = Harness(db_url, open_store(url), url, tmp_path,
                extra_env={**split_seaweed.env(), **SETTINGS})
    try:
        yield h
    finally:
        h.close()


def cli(h: Harness, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "darkroom.cli", *args], env=h.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Watch:
    """Where an operator looks: the worker's metrics, the API's /v1/queue and /metrics
    (admin key), and `darkroom stats`."""

    def __init__(self, h: Harness, worker_metrics: int) -> None:
        key = cli(h, "keys", "create", "--owner", "ops", "--admin").strip().split()[-1]
        port = free_port()
        self.h = h
        self.api = h.start("api", "--port", str(port))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                   headers={"Authorization": f"Bearer {key}"})
        self.worker = httpx.Client(base_url=f"http://127.0.0.1:{worker_metrics}", timeout=30)

    def wait_up(self) -> None:
        wait_for(self._up, timeout=60, what="the API")

    def _up(self) -> bool:
        assert self.api.proc.poll() is None, self.api.log()
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def worker_metric(self, name: str) -> float:
        text = self.worker.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    def paused_everywhere(self) -> bool:
        stats = json.loads(cli(self.h, "stats", "--json"))
        queue = self.client.get("/v1/queue").json()
        metrics = self.client.get("/metrics").text
        return (stats["paused_workers"] == [WORKER] and queue["paused_workers"] == [WORKER]
                and "darkroom_queue_paused_workers 1.0" in metrics
                and self.worker_metric("darkroom_worker_paused") == 1)

    def close(self) -> None:
        self.client.close()
        self.worker.close()


def paused_for(h: Harness) -> float:
    row = h.db.execute(SQL["worker_pause_seconds"], {"worker": WORKER}).fetchone()
    return float(row["s"]) if row else -1.0


def start_worker(h: Harness, env: dict[str, str], metrics_port: int) -> Any:
    return h.start("worker", "--concurrency", "2", "--name", WORKER,
                   "--metrics-port", str(metrics_port), env=env)


def wait_started(worker: Any) -> None:
    wait_for(lambda: worker.proc.poll() is None and "worker started" in worker.log(),
             timeout=120, what="the worker")


@pytest.mark.parametrize("outage", ["data_servers_down", "frozen", "throttled"])
def test_a_store_outage_past_the_retry_schedule_rejects_no_file(
        store_harness: Harness, split_seaweed: SeaweedServer, outage: str) -> None:
    h = store_harness
    host, port = split_seaweed.endpoint_url.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)))
    watch = None
    try:
        metrics_port = free_port()
        watch = Watch(h, metrics_port)  # the API starts while the files are uploaded
        ids = h.upload_many(small_photos(FILES + BEFORE + SPARE))
        worker = start_worker(h, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"},
                              metrics_port)
        wait_started(worker)
        watch.wait_up()
        wait_for(lambda: h.statuses(ids).get("ready", 0) >= BEFORE, timeout=120,
                 what="progress before the outage")
        if outage == "data_servers_down":
            split_seaweed.stop_volume()
        elif outage == "frozen":
            split_seaweed.freeze()
        else:
            proxy.throttle()
        waiting = len(ids) - h.statuses(ids).get("ready", 0)
        try:
            wait_for(lambda: paused_for(h) >= 0, timeout=60, what="the worker to pause")
            wait_for(watch.paused_everywhere, timeout=60, what="the pause shown everywhere")
            wait_for(lambda: paused_for(h) >= HELD_SECONDS, timeout=120,
                     what="an outage past the whole retry schedule")
            during = h.statuses(ids)
        finally:
            if outage == "data_servers_down":
                split_seaweed.start_volume()
            elif outage == "frozen":
                split_seaweed.thaw()
            else:
                proxy.heal()
        wait_for(lambda: paused_for(h) < 0, timeout=120, what="the worker to resume")
        wait_for(lambda: h.all_finished(ids), timeout=300, what="every card final")
        assert waiting >= FILES
        assert "rejected" not in during, during
        assert h.statuses(ids) == {"ready": len(ids)}
        cards = h.db.execute(SQL["attempts_and_deferrals"]).fetchall()
        assert max(c["attempts"] for c in cards) <= 3
        # The store served nothing between any file's tries: nothing counted.
        assert sum(c["deferrals"] for c in cards) == 0, cards
        deferred = h.events(kind="deferred")
        assert deferred and {e["error_code"] for e in deferred} == {"storage_unavailable"}
        assert watch.worker_metric("darkroom_worker_paused") == 0
        assert watch.worker_metric("darkroom_store_breaker_opened_total") >= 1
        log = worker.log()
        assert "object store failing" in log and "answers again" in log
        assert "Traceback" not in log
        if outage == "throttled":
            assert proxy.counters.throttled >= 2, proxy.counters
        for file_id in ids:
            h.assert_published_once(file_id)
        print(f"\n{outage}: {waiting} files waiting; held {HELD_SECONDS} s paused; deferrals"
              f" {len(deferred)} (counted {sum(c['deferrals'] for c in cards)});"
              f" max attempts {max(c['attempts'] for c in cards)}; {proxy.counters}")
    finally:
        if watch is not None:
            watch.close()
        proxy.close()


def test_a_file_the_store_fails_alone_is_rejected_after_the_bound(
        store_harness: Harness, split_seaweed: SeaweedServer) -> None:
    """The store fails every request for one file's original (503 SlowDown) and serves
    the rest: that file is the file's problem. Each deferral counts, the third rejects it,
    and the worker never stops claiming for it."""
    h = store_harness
    host, port = split_seaweed.endpoint_url.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)))
    try:
        photos = small_photos(FILES + 1)
        [poison] = h.upload_many(photos[:1])
        proxy.throttle(f"/{original_key(poison, 'tester')}?".encode())
        worker = start_worker(h, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
                                  "DARKROOM_MAX_DEFERRALS": "3"}, free_port())
        ids = h.upload_many(photos[1:])
        wait_started(worker)
        wait_for(lambda: h.all_finished([poison, *ids]), timeout=300,
                 what="every card final")
        assert h.statuses(ids) == {"ready": FILES}
        card = h.card(poison)
        assert (card["status"], card["error_code"], card["deferrals"]) == (
            "rejected", "storage_unavailable", 3)
        assert card["attempts"] == 1
        assert [e["kind"] for e in h.events(poison)] == [
            "claimed", "deferred_counted", "claimed", "deferred_counted", "claimed",
            "exhausted"]
        assert proxy.counters.throttled >= 3, proxy.counters
        log = worker.log()
        assert "object store failing" not in log  # the store served: never paused
        assert "rejected" in log and "Traceback" not in log
        assert h.db.execute(SQL["deferrals_but"], {"id": poison}).fetchone() == {"n": 0}
    finally:
        proxy.close()


def test_a_file_that_knocks_the_store_over_is_rejected_after_the_bound(
        store_harness: Harness, split_seaweed: SeaweedServer) -> None:
    """Each request for one file's original makes the whole store answer 503 SlowDown for
    5 s. The first time, nothing tells that file from an outage: deferred, not counted.
    (The window outlasts the client's own retry of the GET and of the probe's PUT, each
    up to 1 s of backoff, with room for a loaded machine: a probe that saw the store
    stand up again would rightly count the first deferral.)
    Each later try follows a store that served (the probe that closed the breaker), so it
    counts, and the third counted deferral rejects the file. Each time the worker pauses
    only until the store stands up and one probe sees it."""
    h = store_harness
    host, port = split_seaweed.endpoint_url.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)))
    try:
        photos = small_photos(21)
        [poison] = h.upload_many(photos[:1])
        proxy.throttle(f"/{original_key(poison, 'tester')}?".encode(), knock_over=5.0)
        # One slot: only the poison is under way when it knocks the store over.
        worker = h.start("worker", "--concurrency", "1", "--name", WORKER,
                         env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
                              "DARKROOM_MAX_DEFERRALS": "3"})
        ids = h.upload_many(photos[1:])
        wait_for(lambda: h.all_finished([poison, *ids]), timeout=300,
                 what="every card final")
        assert h.statuses(ids) == {"ready": 20}
        card = h.card(poison)
        assert (card["status"], card["error_code"], card["deferrals"], card["attempts"]) == (
            "rejected", "storage_unavailable", 3, 1)
        assert [e["kind"] for e in h.events(poison)] == [
            "claimed", "deferred", "claimed", "deferred_counted", "claimed",
            "deferred_counted", "claimed", "exhausted"]
        assert proxy.counters.knocked_over >= 4, proxy.counters

        def pauses() -> list[float]:
            entries = [json.loads(line) for line in worker.log().splitlines()
                       if line.startswith("{")]
            return [e["paused_seconds"] for e in entries
                    if e["msg"] == "object store answers again; claiming"]

        # Four knocks, four pauses (the last may still be ending as the card is rejected);
        # each ends with the first probe after the store stands up (probes back off to the
        # retry cap, 1 s). A deadline, not a measurement.
        wait_for(lambda: len(pauses()) >= 4, timeout=60,
                 what="the worker to resume after the last knock")
        paused = pauses()
        assert len(paused) == 4 and max(paused) < 10, paused
        assert h.db.execute(SQL["deferrals_but"], {"id": poison}).fetchone() == {"n": 0}
        print(f"\nknocked over: pauses {paused} s; {proxy.counters}")
    finally:
        proxy.close()
