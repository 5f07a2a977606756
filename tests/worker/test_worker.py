"""Real worker processes against real PostgreSQL and SeaweedFS, under kills and signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.derive import images as im
from tests.support.services import Harness, corpus_photos, free_port, wait_for
from tests.support.sql import SQL

# A fleet of real processes: not in `make test-fast`.
pytestmark = pytest.mark.fleet

PHOTOS = corpus_photos()


def photo(i: int = 0) -> bytes:
    return PHOTOS[i % len(PHOTOS)].read_bytes()



def sweep_once(h: Harness) -> str:
    out = subprocess.run([sys.executable, "-m", "darkroom.cli", "sweep", "--once"],
                         env=h.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_thirty_photos_end_ready_each_published_once(harness: Harness) -> None:
    ids = [harness.upload(photo(i), name=PHOTOS[i % len(PHOTOS)].name) for i in range(30)]
    port = free_port()
    w = harness.start("worker", "--concurrency", "2", "--metrics-port", str(port))
    wait_for(lambda: harness.all_finished(ids), timeout=240, what="30 files finished")
    assert harness.statuses(ids) == {"ready": 30}
    for file_id in ids:
        harness.assert_published_once(file_id)
        card = harness.card(file_id)
        assert max(card["width"], card["height"]) <= 2048
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert 'darkroom_jobs_total{outcome="ready"} 30.0' in metrics
    assert "darkroom_stage_duration_seconds_bucket" in metrics
    # Every stage of every attempt, the decoder's own steps among them.
    for stage in ("fetch", "derive", "derive_spawn", "derive_send", "derive_decode",
                  "derive_receive", "derive_check", "put", "commit"):
        assert f'darkroom_stage_duration_seconds_count{{stage="{stage}"}} 30.0' in metrics
    logs = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    ready = [entry for entry in logs if entry["msg"] == "ready"]
    assert len(ready) == 30
    assert all({"file_id", "attempt", "token"} <= set(entry) for entry in ready)


def test_phone_formats_end_ready_and_a_broken_heic_is_invalid(harness: Harness) -> None:
    picture = im.quadrants(1200, 900)
    good = [im.heic(picture), im.save(picture, "AVIF"), im.save(picture, "TIFF")]
    heic = good[0]
    ids = [harness.upload(data, name=f"p{i}") for i, data in enumerate(good)]
    broken = harness.upload(heic[: len(heic) // 2], name="cut.heic")
    harness.start("worker", "--concurrency", "2")
    wait_for(lambda: harness.all_finished([*ids, broken]), timeout=120, what="finished")
    for file_id in ids:
        harness.assert_published_once(file_id)
    card = harness.card(broken)
    assert (card["status"], card["error_code"]) == ("rejected", "invalid_image")
    assert card["attempts"] == 1


def test_kill9_mid_job_another_worker_finishes_after_expiry(
        harness: Harness, tmp_path: Path) -> None:
    marker = tmp_path / "hang"
    ids = [harness.upload(photo(i)) for i in range(3)]
    doomed = harness.worker(concurrency=3, child=("hang", str(marker)))
    wait_for(marker.exists, what="a decode in progress")
    wait_for(lambda: harness.statuses(ids).get("processing", 0) == 3, what="3 leases")
    doomed.kill9()
    harness.worker(concurrency=2)
    wait_for(lambda: harness.all_finished(ids), timeout=120, what="files finished")
    for file_id in ids:
        harness.assert_published_once(file_id)
        assert harness.card(file_id)["attempts"] == 2


def test_frozen_worker_cannot_publish_and_its_orphan_is_swept(harness: Harness) -> None:
    [file_id] = [harness.upload(photo(0))]
    frozen = harness.worker(concurrency=1)
    wait_for(lambda: harness.card(file_id)["status"] == "processing", what="first lease")
    frozen.signal(signal.SIGSTOP)
    stale_token = harness.card(file_id)["lease_token"]
    rescuer = harness.worker(concurrency=1)
    wait_for(lambda: harness.card(file_id)["status"] == "ready", timeout=60, what="rescue")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    frozen.signal(signal.SIGCONT)
    wait_for(lambda: any(e["token"] == stale_token
                         for e in harness.events(file_id, "lease_lost")),
             what="the stale attempt's lease_lost")
    frozen.signal(signal.SIGTERM)
    assert frozen.wait() == 0
    harness.assert_published_once(file_id)
    card = harness.card(file_id)
    assert str(stale_token) not in card["derived_key"]
    sweep_once(harness)
    assert harness.object_keys(file_id) == sorted([
        f"{card['original_key']}@{card['original_version']}",
        f"{card['derived_key']}@{card['derived_version']}",
        f"{card['thumb_key']}@{card['thumb_version']}",
    ])
    assert harness.db.execute(SQL["orphan_count"]).fetchone() == {"n": 0}


def test_killed_in_every_attempt_ends_attempts_exhausted(harness: Harness,
                                                         tmp_path: Path) -> None:
    file_id = harness.upload(photo(1))
    for attempt in (1, 2, 3):
        marker = tmp_path / f"hang-{attempt}"
        w = harness.worker(concurrency=1, child=("hang", str(marker)))
        wait_for(marker.exists, what=f"attempt {attempt} decoding")
        assert harness.card(file_id)["attempts"] == attempt
        w.kill9()
    harness.worker(concurrency=1)
    wait_for(lambda: harness.card(file_id)["status"] == "rejected", timeout=60,
             what="exhausted")
    card = harness.card(file_id)
    assert card["error_code"] == "attempts_exhausted" and card["attempts"] == 3
    assert len(harness.events(file_id, "claimed")) == 3


def test_sigterm_hands_back_long_jobs_and_exits_zero(harness: Harness,
                                                     tmp_path: Path) -> None:
    marker = tmp_path / "hang"
    ids = [harness.upload(photo(i)) for i in range(2)]
    w = harness.worker(concurrency=2, child=("hang", str(marker)),
                       shutdown_grace_seconds="1")
    wait_for(lambda: harness.statuses(ids).get("processing", 0) == 2, what="2 leases")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    assert harness.statuses(ids) == {"queued": 2}
    for file_id in ids:
        assert [e["kind"] for e in harness.events(file_id)][-1] == "released"
    harness.worker(concurrency=2)
    wait_for(lambda: harness.all_finished(ids), timeout=120, what="finished after hand-back")
    for file_id in ids:
        harness.assert_published_once(file_id)


def test_sigterm_lets_running_jobs_finish_within_the_grace(harness: Harness) -> None:
    ids = [harness.upload(photo(i)) for i in range(6)]
    w = harness.worker(concurrency=2, shutdown_grace_seconds="60")
    wait_for(lambda: harness.statuses(ids).get("processing", 0) >= 1, what="a lease")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0
    statuses = harness.statuses(ids)
    assert "processing" not in statuses
    assert statuses.get("ready", 0) >= 1
    # No job that ran was handed back; only the leases kept ahead of the slots, never
    # started, with their attempt given back.
    assert {e["attempt"] for e in harness.events(kind="released")} <= {0}


def test_delete_during_processing_publishes_nothing_and_is_purged(
        harness: Harness, tmp_path: Path) -> None:
    marker = tmp_path / "hang"
    file_id = harness.upload(photo(2))
    w = harness.worker(concurrency=1, child=("hang", str(marker)))
    wait_for(marker.exists, what="decoding")
    harness.revoke(file_id)
    wait_for(lambda: harness.events(file_id, "lease_lost"), timeout=30,
             what="the heartbeat noticing the revoke")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    assert harness.card(file_id)["status"] == "deleting"
    assert not harness.events(file_id, "ready")
    sweep_once(harness)
    assert harness.db.execute(SQL["cards_with_id"], {"id": file_id}).fetchone() == {"n": 0}
    assert harness.object_keys(file_id) == []


@pytest.mark.slow
def test_outages_postgres_restart_and_frozen_s3(harness: Harness, postgres: object,
                                                 seaweed: object) -> None:
    from tests.support.postgres import TestPostgres
    from tests.support.seaweed import SeaweedServer

    assert isinstance(postgres, TestPostgres) and isinstance(seaweed, SeaweedServer)
    if postgres.pgdata is None:
        pytest.skip("the PostgreSQL under test is not ours to restart")
    ids = [harness.upload(photo(i)) for i in range(12)]
    for _ in range(2):
        # A request to the frozen store is its failure after 2 × 2 s (the default: 2 × 10 s).
        harness.worker(concurrency=2, max_attempts="20", storage_timeout_seconds="2")
    wait_for(lambda: harness.statuses(ids).get("ready", 0) >= 2, timeout=120, what="progress")
    postgres.restart()
    wait_for(lambda: harness.reconnect() and harness.statuses(ids).get("ready", 0) >= 4,
             timeout=120, what="progress after the restart")
    with seaweed.frozen():
        # The store is down, not the files: cards go back with their attempt given back,
        # and the workers stop claiming and say so.
        wait_for(lambda: harness.events(kind="deferred"), timeout=60,
                 what="a card handed back for the store")
        wait_for(lambda: harness.value("worker_pause_count") > 0,
                 timeout=60, what="a worker paused")
    wait_for(lambda: harness.all_finished(ids), timeout=240, what="all finished")
    assert harness.statuses(ids) == {"ready": 12}
    assert all(e["error_code"] == "storage_unavailable" for e in harness.events(kind="deferred"))
    for file_id in ids:
        harness.assert_published_once(file_id)


@pytest.mark.parametrize("attack", ["environ", "exec"])
def test_compromised_decoder_is_an_ordinary_failure_and_the_jail_is_logged_once(
        harness: Harness, attack: str) -> None:
    """A decoder that tries to steal secrets or run a shell fails the file, not the worker."""
    ids = [harness.upload(photo(i)) for i in range(2)]
    w = harness.worker(concurrency=1, child=(attack, str(harness.tmp / "pwned")))
    wait_for(lambda: harness.all_finished(ids), timeout=120, what="hostile files finished")
    assert harness.statuses(ids) == {"rejected": 2}
    assert {harness.card(i)["error_code"] for i in ids} == {"processing_failed"}
    assert w.proc.poll() is None  # the worker itself carries on
    log = w.log()
    for name in ("DARKROOM_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"):
        secret = harness.env.get(name)
        if secret:
            assert secret not in log
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    jail = [entry for entry in entries if entry["msg"] == "decoder jail"]
    assert len(jail) == 1
    assert jail[0]["jail_seccomp"] is True and jail[0]["jail_no_new_privs"] is True
    assert jail[0]["jail_empty_environment"] is True
    failed = [entry for entry in entries if entry["msg"] == "attempt failed"]
    assert len(failed) == 2
    if attack == "exec":
        assert all("SIGSYS" in entry["detail"] for entry in failed)
    else:
        assert all("parent environ: refused" in entry["detail"] for entry in failed)


@pytest.mark.parametrize("forgery", ["file", "oversized"])
def test_a_forged_derivative_is_never_stored(harness: Harness, forgery: str) -> None:
    """A compromised decoder answering another file, or a huge blob, as a derivative."""
    ids = [harness.upload(photo(i)) for i in range(2)]
    w = harness.worker(concurrency=1, child=("forge", forgery))
    wait_for(lambda: harness.all_finished(ids), timeout=120, what="forged files finished")
    assert harness.statuses(ids) == {"rejected": 2}
    for file_id in ids:
        card = harness.card(file_id)
        assert card["error_code"] == "processing_failed"
        assert card["derived_key"] is None
        # Only the original: no forged derivative (nor thumb) was ever put in the store.
        assert harness.object_keys(file_id) == [
            f"{card['original_key']}@{card['original_version']}"]
    assert w.proc.poll() is None


def test_two_owners_share_the_workers_and_a_rederive_replaces_every_derivative(
        harness: Harness) -> None:
    # Owner a's import is waiting when owner b uploads one photo: b's is claimed within
    # about one job of a slot freeing, not after a's whole backlog.
    a_ids = [harness.upload(photo(i), owner="a") for i in range(10)]
    harness.worker(concurrency=2)
    wait_for(lambda: harness.statuses(a_ids).get("ready", 0) >= 1, timeout=120,
             what="a's import under way")
    mark = harness.db.execute(SQL["last_event"]).fetchone()
    assert mark is not None
    b_id = harness.upload(photo(3), owner="b")
    wait_for(lambda: harness.all_finished([*a_ids, b_id]), timeout=240, what="all finished")
    claims = [e["file_id"] for e in harness.db.execute(
        SQL["claims_after"], {"after": mark["m"]}).fetchall()]
    assert b_id in claims and claims.index(b_id) <= 2, claims
    for file_id in [*a_ids, b_id]:
        harness.assert_published_once(file_id)

    # New derivative settings: every card is re-derived as bulk work; the command waits
    # with a progress bar, and the replaced derivatives go to the sweeper.
    for proc in harness.processes:
        proc.stop()
    old = {i: harness.card(i)["derived_key"] for i in [*a_ids, b_id]}
    old_thumbs = {harness.card(i)["thumb_key"] for i in old}
    small = {"DARKROOM_DERIVATIVE_MAX_EDGE": "256"}
    harness.worker(concurrency=2, derivative_max_edge="256")
    out = subprocess.run([sys.executable, "-m", "darkroom.cli", "rederive", "--all", "--wait"],
                         env={**harness.env, **small}, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assert "queued 11 re-derive(s)" in out.stdout and "11/11" in out.stderr
    for file_id, key in old.items():
        card = harness.card(file_id)
        assert card["status"] == "ready" and card["priority"] == "bulk"
        assert card["derived_key"] != key and max(card["width"], card["height"]) <= 256
    orphans = harness.db.execute(SQL["superseded_orphans"]).fetchall()
    # The previous preview and thumb of every card, both superseded.
    assert {o["object_key"] for o in orphans} == set(old.values()) | old_thumbs
    sweep_once(harness)
    for file_id in old:
        card = harness.card(file_id)
        assert [k for k in harness.object_keys(file_id) if k.startswith("derived/")] == sorted([
            f"{card['derived_key']}@{card['derived_version']}",
            f"{card['thumb_key']}@{card['thumb_version']}"])
