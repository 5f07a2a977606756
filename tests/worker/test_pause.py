"""An operator's pause with real worker processes: taken while both workers are busy,
running attempts finish, nothing of the paused owner starts (other work goes on, and a
restarted worker keeps to the pause), and the resume lets the rest through."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import pytest

from tests.support.services import CORPUS, Harness, wait_for
from tests.support.sql import SQL

pytestmark = pytest.mark.fleet

PHOTOS = sorted(p for p in CORPUS.iterdir() if p.suffix == ".jpg")


def cli(h: Harness, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "darkroom.cli", *args], env=h.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def started(h: Harness, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """The cards of `ids` an attempt was ever started on."""
    rows = h.db.execute(SQL["claimed_among"], {"ids": ids}).fetchall()
    return {r["file_id"] for r in rows}


def test_a_pause_lets_running_work_finish_starts_nothing_and_holds_until_resumed(
        harness: Harness) -> None:
    h = harness
    ids = [h.upload(PHOTOS[i % len(PHOTOS)].read_bytes(), owner="tester",
                    name=PHOTOS[i % len(PHOTOS)].name) for i in range(12)]
    first = h.worker(concurrency=1)
    h.worker(concurrency=1)
    # Both workers busy: each holds a card it decodes and one kept ahead of its slot.
    wait_for(lambda: h.statuses(ids).get("processing", 0) >= 4, timeout=60,
             what="both workers busy")

    out = cli(h, "pause", "--owner", "tester")
    assert out.startswith("paused: owner tester")
    # Whatever a worker holds by now was claimed before the pause: what it decodes (or
    # commits) finishes; what it kept ahead of its slot goes back unstarted.
    before = started(h, ids)
    running = {r["id"] for r in h.db.execute(SQL["processing_among"], {"ids": ids}).fetchall()}
    assert running and running <= before and len(before) < len(ids)

    # Another owner's card is claimed and finished meanwhile: the workers are claiming,
    # and passing over the paused owner's cards.
    other = h.upload(PHOTOS[0].read_bytes(), owner="visitor")
    wait_for(lambda: h.card(other)["status"] == "ready", timeout=120, what="other owner")
    wait_for(lambda: not running & {i for i in ids if h.card(i)["status"] == "processing"},
             timeout=120, what="the attempts running at the pause to end")
    ran = {i for i in ids if h.card(i)["status"] == "ready"}
    assert ran and ran <= before
    for file_id in before - ran:  # kept ahead at the pause: handed back, never started
        last = h.events(file_id)[-1]
        assert (last["kind"], last["attempt"]) == ("released", 0), last
    assert started(h, ids) == before

    # The pause is in the database: a worker started now keeps to it too.
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    h.worker(concurrency=1)
    late = h.upload(PHOTOS[1].read_bytes(), owner="visitor")
    wait_for(lambda: h.card(late)["status"] == "ready", timeout=120, what="after a restart")
    assert started(h, ids) == before
    assert h.statuses(ids) == {"ready": len(ran), "queued": len(ids) - len(ran)}
    stats = cli(h, "stats")
    assert "claiming paused        owner tester (by cli:" in stats

    assert cli(h, "resume", "--owner", "tester").startswith("resumed: owner tester")
    wait_for(lambda: h.all_finished(ids), timeout=240, what="the rest after the resume")
    assert h.statuses(ids) == {"ready": len(ids)}
    for file_id in ids:
        h.assert_published_once(file_id)
    log = h.db.execute(SQL["claim_pause_log"]).fetchall()
    assert [(e["kind"], e["owner"]) for e in log] == [("paused", "tester"),
                                                      ("resumed", "tester")]
    assert all(e["actor"].startswith("cli:") for e in log)
    assert "claiming paused        no" in cli(h, "stats")

    # The history of one card, as an operator reads it.
    shown = cli(h, "show", str(ids[-1]))
    assert f"card      {ids[-1]}" in shown and "owner     tester" in shown
    kinds = [line.split()[2] for line in shown.splitlines()[10:]]
    assert kinds == ["claimed", "ready"]
