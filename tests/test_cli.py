"""The command line: embedded and external databases, bad configuration, derive."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from darkroom.layout import derived_key, original_key
from tests.support.services import CORPUS
from tests.support.sql import SQL, Attempt

STATS_KEYS = {"counts", "oldest_claimable_age_seconds", "expired_leases", "rejected_share_1h",
              "rejected_share_24h", "completed_last_minute", "lease_lost_total"}


def darkroom(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    return subprocess.run([sys.executable, "-m", "darkroom.cli", *args],
                          env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not under pytest's tmp dirs, which are private to root: the embedded server runs as
    # the unprivileged `darkroom` user when the tests run as root.
    base = Path(tempfile.mkdtemp(prefix="darkroom-cli-"))
    base.chmod(0o755)
    yield base / "data"
    from darkroom.db import embedded

    embedded.remove(base / "data" / "pg")
    shutil.rmtree(base, ignore_errors=True)


def test_migrate_and_stats_share_the_embedded_database(data_dir: Path) -> None:
    env = {"DARKROOM_DATA_DIR": str(data_dir)}
    first = darkroom("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert "applied" in first.stdout
    again = darkroom("migrate", env=env)
    assert again.returncode == 0 and "up to date" in again.stdout
    stats = darkroom("stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    assert set(json.loads(stats.stdout)) >= STATS_KEYS
    human = darkroom("--data-dir", str(data_dir), "stats")
    assert human.returncode == 0 and "expired leases" in human.stdout


def test_migrate_and_stats_on_an_external_database(empty_db_url: str) -> None:
    env = {"DARKROOM_DATABASE_URL": empty_db_url}
    assert darkroom("migrate", env=env).returncode == 0
    stats = darkroom("stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["counts"]["queued"] == 0


@pytest.mark.parametrize(("name", "value"), [
    ("DARKROOM_LEASE_SECONDS", "soon"),
    ("DARKROOM_MAX_ATTEMPTS", "0"),
    ("DARKROOM_STORAGE_URL", "ftp://example/bucket"),
    ("DARKROOM_DATABASE_URL", "mysql://nope"),
    ("DARKROOM_MAX_UPLOAD_BYTES", "-5"),
    ("DARKROOM_BULK_SHARE", "1.5"),
])
def test_bad_configuration_is_one_line_and_exit_2(name: str, value: str) -> None:
    out = darkroom("stats", env={name: value})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_unreachable_database_is_one_line() -> None:
    out = darkroom("stats", env={"DARKROOM_DATABASE_URL": "postgresql://127.0.0.1:1/x"})
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_derive_prints_one_json_object(tmp_path: Path) -> None:
    out_path = tmp_path / "out.webp"
    ok = darkroom("derive", str(CORPUS / "LadyBird.jpg"), "-o", str(out_path))
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert set(result) == {"width", "height", "bytes", "sha256"}
    assert max(result["width"], result["height"]) == 2048
    assert out_path.stat().st_size == result["bytes"]
    junk = tmp_path / "junk.jpg"
    junk.write_text("not an image")
    bad = darkroom("derive", str(junk))
    assert bad.returncode == 1 and json.loads(bad.stdout) == {"error_code": "unsupported_format"}


def test_rederive_queues_stale_cards_once_and_stats_count_them(db_url: str) -> None:
    import psycopg

    # Three ready cards: two of alice made with other settings, one of bob likewise.
    with psycopg.connect(db_url, autocommit=True) as conn:
        owners = ["alice", "alice", "bob"]
        ids = [uuid.uuid4() for _ in owners]
        conn.execute(SQL["seed_ready"], {
            "ids": ids, "owners": owners,
            "keys": [original_key(i, o) for i, o in zip(ids, owners, strict=True)],
            "derived": [derived_key(Attempt(i, uuid.uuid4())) for i in ids]})
    env = {"DARKROOM_DATABASE_URL": db_url}
    assert darkroom("rederive", env=env).returncode == 2  # neither --owner nor --all
    dry = darkroom("rederive", "--all", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "3 ready card(s) of all owners" in dry.stdout
    one = darkroom("rederive", "--owner", "bob", env=env)
    assert one.returncode == 0 and "queued 1 re-derive(s)" in one.stdout
    rest = darkroom("rederive", "--all", env=env)
    assert rest.returncode == 0 and "queued 2 re-derive(s)" in rest.stdout
    again = darkroom("rederive", "--all", env=env)
    assert "queued 0 re-derive(s)" in again.stdout
    stats = json.loads(darkroom("stats", "--json", env=env).stdout)
    assert stats["rederive_pending"] == 3
    assert stats["backlog"]["by_priority"]["bulk"]["waiting"] == 3
    assert [o["owner"] for o in stats["backlog"]["top_owners"]] == ["alice", "bob"]
    human = darkroom("stats", env=env).stdout
    assert "re-derives pending     3" in human and "alice" in human


def test_pause_resume_and_show_answer_in_one_line_and_are_safe_to_repeat(
        db_url: str) -> None:
    import uuid

    env = {"DARKROOM_DATABASE_URL": db_url}
    first = darkroom("pause", "--priority", "bulk", env=env)
    assert first.returncode == 0 and first.stdout.startswith("paused: bulk cards"), first
    again = darkroom("pause", "--priority", "bulk", env=env)
    assert again.returncode == 0 and again.stdout.startswith("already paused: bulk cards, by cli:")
    stats = json.loads(darkroom("stats", "--json", env=env).stdout)
    assert [(p["owner"], p["priority"]) for p in stats["claim_pauses"]] == [(None, "bulk")]
    assert stats["claim_pauses"][0]["paused_by"].startswith("cli:")
    for bad in (("pause", "--owner", " "), ("resume", "--all", "--owner", "x"),
                ("show", "not-an-id")):
        refused = darkroom(*bad, env=env)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (bad, refused)
        assert "Traceback" not in refused.stderr
    assert darkroom("pause", "--priority", "urgent", env=env).returncode == 2  # argparse's
    missing = darkroom("show", str(uuid.uuid4()), env=env)
    assert missing.returncode == 1 and "no card" in missing.stderr
    assert darkroom("resume", env=env).stdout.startswith("nothing to resume")
    lifted = darkroom("resume", "--priority", "bulk", env=env)
    assert lifted.returncode == 0 and lifted.stdout.startswith("resumed: bulk cards")
    assert darkroom("resume", "--all", env=env).stdout.startswith("nothing to resume")
    stats = json.loads(darkroom("stats", "--json", env=env).stdout)
    assert stats["claim_pauses"] == []
    assert [(e["kind"], e["priority"]) for e in stats["claim_pause_log"]] == [
        ("resumed", "bulk"), ("paused", "bulk")]  # newest first, a repeat no event
    assert "last resumed           bulk cards by cli:" in darkroom("stats", env=env).stdout


def test_reconcile_keeps_an_original_without_a_card_and_restore_gives_it_one(
        db_url: str, tmp_path: Path) -> None:
    import uuid

    import psycopg

    from darkroom.layout import original_key
    from darkroom.storage import open_store

    storage = (tmp_path / "objects").as_uri()
    env = {"DARKROOM_DATABASE_URL": db_url, "DARKROOM_STORAGE_URL": storage,
           "DARKROOM_DATA_DIR": str(tmp_path / "data"), "DARKROOM_SWEEP_GUARD_SECONDS": "0"}
    assert darkroom("keys", "create", "--owner", "alice", env=env).returncode == 0
    # Uploads whose cards a failover lost: one stored before owners were in the key, one
    # of bob's under the current layout (bob holds no key: the key names him anyway).
    file_id, bobs = uuid.uuid4(), uuid.uuid4()
    old_key, bob_key = original_key(file_id, None), original_key(bobs, "bob")
    version = open_store(storage).put(old_key, b"\xff\xd8\xff" + b"\0" * 61)
    bob_version = open_store(storage).put(bob_key, b"\xff\xd8\xff" + b"\0" * 29)
    plain = darkroom("reconcile", env=env)
    assert plain.returncode == 0, plain.stderr
    assert (f"kept original {old_key}@{version}: no card holds it and its key names no"
            " owner; --restore gives it to alice (the one owner)") in plain.stdout
    assert (f"kept original {bob_key}@{bob_version}: no card holds it; --restore gives it"
            " to bob (named in its key)") in plain.stdout
    assert plain.stdout.strip().endswith("originals kept: 2, restored: 0, deleted: 0")
    both = darkroom("reconcile", "--restore", "--delete-originals", env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    restore = darkroom("reconcile", "--restore", env=env)
    assert restore.returncode == 0, restore.stderr
    assert (f"restored {old_key}@{version} for alice (its key names no owner: --owner,"
            " or the one owner with API keys)") in restore.stdout
    assert f"restored {bob_key}@{bob_version} for bob (named in its key)" in restore.stdout
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(SQL["originals_by_size"]).fetchall()
    assert rows == [(bobs, "bob", "queued", bob_key, bob_version, 32),
                    (file_id, "alice", "queued", old_key, version, 64)]
    again = darkroom("reconcile", env=env)
    assert again.stdout.strip().endswith("originals kept: 0, restored: 0, deleted: 0")


def test_retry_takes_back_rejected_cards_once(db_url: str) -> None:
    import psycopg

    # Rejected: two of alice for a passing fault (one long ago), one of bob for his bytes.
    with psycopg.connect(db_url, autocommit=True) as conn:
        owners = ["alice", "alice", "bob"]
        ids = [uuid.uuid4() for _ in owners]
        conn.execute(SQL["seed_rejected"], {
            "ids": ids, "owners": owners,
            "keys": [original_key(i, o) for i, o in zip(ids, owners, strict=True)],
            "codes": ["storage_unavailable", "attempts_exhausted", "invalid_image"],
            "days": [0, 30, 0]})
    env = {"DARKROOM_DATABASE_URL": db_url}
    bad = darkroom("retry", "--code", "nope", env=env)
    assert bad.returncode == 2 and "--code 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    dry = darkroom("retry", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "2 rejected card(s) of all owners" in dry.stdout
    from datetime import UTC, datetime, timedelta

    # Only what was rejected in the last ten days (UTC without a zone): not the old one.
    since = (datetime.now(UTC) - timedelta(days=10)).strftime("%Y-%m-%dT%H:%M")
    recent = darkroom("retry", "--since", since, env=env)
    assert recent.returncode == 0 and "queued 1 retry(s)" in recent.stdout, recent.stderr
    rest = darkroom("retry", "--all", "--wait", "--owner", "nobody", env=env)
    assert rest.returncode == 0 and "queued 0 retry(s)" in rest.stdout
    every = darkroom("retry", "--all", env=env)  # the old one, and bob's whatever its code
    assert every.returncode == 0 and "queued 2 retry(s)" in every.stdout
    again = darkroom("retry", "--all", env=env)
    assert "queued 0 retry(s)" in again.stdout
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(SQL["retried_cards"]).fetchall()
    assert len(rows) == 3
    assert {(s, a, p) for s, a, p, _ in rows} == {("queued", 0, "bulk")}
    assert all(w.startswith("cli:") for *_, w in rows)
