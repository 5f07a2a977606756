"""The page's event stream in real headless Chromium, against an API whose streams end
at a small max age: the page reconnects each time and the cards it shows stay shown and
stay current."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from tests.api.conftest import start_api
from tests.api.helpers import assert_problem, confirmed, make_ready
from tests.api.test_events import WEBP
from tests.support.browser import Chromium
from tests.support.sql import SQL

pytestmark = pytest.mark.browser

# Counts every card element the page takes out of its grid, and every time the grid is
# empty, from the moment it is installed.
_WATCH = """() => {
  window.__gone = 0;
  const grid = document.querySelector('.grid');
  new MutationObserver((changes) => {
    for (const change of changes) {
      for (const node of change.removedNodes) {
        if (node.dataset && node.dataset.testid === 'card') window.__gone += 1;
      }
    }
  }).observe(grid, { childList: true, subtree: true });
}"""


def test_page_reconnects_at_the_streams_max_age_without_a_gap(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect

    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local",
                            events_max_seconds=1.5)
    try:
        key = api.make_key("streamer")
        with api.client(key) as c:
            card = confirmed(c)
        page = chromium.page(api.url, key)
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(1, timeout=10_000)
        expect(cards.first).to_have_attribute("data-status", "queued")
        page.evaluate(_WATCH)
        # The server ends the stream at its max age; the page opens it again,
        # each time.
        page.wait_for_function("() => window.darkroomStats.streams >= 4",
                               timeout=30_000)
        # A change after those reconnects still reaches the page.
        # (In a thread of its own: Playwright's loop runs in this one.)
        worker = threading.Thread(target=make_ready, args=(
            api.db_url, api.settings, api.store, card["id"], WEBP))
        worker.start()
        worker.join(30)
        expect(cards.first).to_have_attribute("data-status", "ready", timeout=15_000)
        # Throughout, the card stayed shown: nothing was taken out and put back.
        assert page.evaluate("() => window.__gone") == 0
        expect(cards).to_have_count(1)
        with api.client(key) as c:
            assert c.get(f"/v1/files/{card['id']}").json()["status"] == "ready"
            assert_problem(api.client(None).get("/v1/events"), 401, "unauthorized")
    finally:
        server.stop()


def test_a_resync_takes_out_a_card_deleted_unnoticed_after_it_was_ready(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # A page told to re-read (here at each reconnect after its stream's max age) reads
    # again every card it shows, not only those on their way: one deleted from another
    # tab while its notices were down goes.
    expect = chromium.expect
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local",
                            events_max_seconds=1.5)
    try:
        key = api.make_key("streamer")
        with api.client(key) as c:
            kept, gone = confirmed(c), confirmed(c)
        for card in (kept, gone):
            make_ready(api.db_url, api.settings, api.store, card["id"], WEBP)
        page = chromium.page(api.url, key)
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(2, timeout=10_000)
        for i in range(2):
            expect(cards.nth(i)).to_have_attribute("data-status", "ready")
        streams = page.evaluate("() => window.darkroomStats.streams")
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            conn.execute(SQL["delete_card_unnoticed"], {"id": gone["id"]})
        page.wait_for_function(f"() => window.darkroomStats.streams > {streams}",
                               timeout=30_000)
        expect(cards).to_have_count(1, timeout=15_000)
        expect(cards.first).to_have_attribute("data-id", kept["id"])
    finally:
        server.stop()
