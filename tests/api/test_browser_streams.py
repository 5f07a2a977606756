"""The page's event stream in real headless Chromium, against an API whose streams end
at a small max age: the page reconnects each time and the cards it shows stay shown and
stay current."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.api.conftest import Api, start_api
from tests.api.helpers import JPEG, assert_problem, confirmed, make_ready
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


# --- the page's re-reads ---------------------------------------------------------------

OWNER = "streamer"

# Counts every card element the page adds to its grid from the moment it is installed.
_ADDED = """() => {
  window.__added = 0;
  new MutationObserver((changes) => {
    for (const change of changes) {
      for (const node of change.addedNodes) {
        if (node.dataset && node.dataset.testid === 'card') window.__added += 1;
      }
    }
  }).observe(document.querySelector('.grid'), { childList: true, subtree: true });
}"""


@dataclass
class Served:
    """An API of its own, a key of OWNER's, and the browser."""

    api: Api
    key: str
    chromium: Chromium

    def confirmed(self, n: int) -> list[dict[str, Any]]:
        """`n` cards made from elsewhere (another tab, an import), each confirmed."""
        made: list[dict[str, Any]] = []

        def run() -> None:
            with self.api.client(self.key) as c:
                made.extend(confirmed(c) for _ in range(n))

        maker = threading.Thread(target=run)  # Playwright's loop runs in this thread
        maker.start()
        maker.join(300)
        return made

    def ready(self, card: dict[str, Any]) -> None:
        make_ready(self.api.db_url, self.api.settings, self.api.store, card["id"], WEBP)

    def page(self, shown: int) -> Any:
        """The page with the key, once it shows `shown` cards and its stream is open."""
        page = self.chromium.page(self.api.url, self.key)
        self.chromium.expect(page.get_by_test_id("card")).to_have_count(shown, timeout=10_000)
        page.wait_for_function("() => window.darkroomStats.events >= 1", timeout=30_000)
        return page

    def unnoticed(self, statement: str, **params: Any) -> None:
        """A change the pages are not told of (as one made while their notices were down)."""
        with psycopg.connect(self.api.db_url, autocommit=True) as conn:
            conn.execute(SQL[statement], params)

    def resync(self) -> None:
        """The hub's `resync` to OWNER's open pages, as after notices it may have missed."""
        self.unnoticed("notify_cards_channel", payload=json.dumps({"o": [OWNER]}))

    def reread(self, page: Any, before: Callable[[], None] = lambda: None) -> None:
        """`before()`, then a resync; answers once the page's re-read has ended."""
        rereads = page.evaluate("() => window.darkroomStats.rereads")
        before()
        self.resync()
        page.wait_for_function(f"() => window.darkroomStats.rereads > {rereads}",
                               timeout=30_000)


@contextmanager
def served(db_url: str, tmp_path: Path, chromium: Chromium,
           **settings: Any) -> Iterator[Served]:
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local",
                            **settings)
    try:
        yield Served(api, api.make_key(OWNER), chromium)
    finally:
        server.stop()


def test_a_resync_takes_out_a_card_deleted_unnoticed_after_it_was_ready(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # A page told to re-read (here at each reconnect after its stream's max age) reads
    # again every card it shows, not only those on their way: one deleted from another
    # tab while its notices were down goes.
    expect = chromium.expect
    with served(db_url, tmp_path, chromium, events_max_seconds=1.5) as s:
        kept, gone = s.confirmed(2)
        for card in (kept, gone):
            s.ready(card)
        page = s.page(shown=2)
        cards = page.get_by_test_id("card")
        for i in range(2):
            expect(cards.nth(i)).to_have_attribute("data-status", "ready")
        streams = page.evaluate("() => window.darkroomStats.streams")
        s.unnoticed("delete_card_unnoticed", id=gone["id"])
        page.wait_for_function(f"() => window.darkroomStats.streams > {streams}",
                               timeout=30_000)
        expect(cards).to_have_count(1, timeout=15_000)
        expect(cards.first).to_have_attribute("data-id", kept["id"])


def test_a_change_told_while_the_listing_is_on_its_way_is_not_undone_by_it(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # The listing's snapshot is taken, then a card is deleted from another tab and the
    # stream tells the page so before the listing's answer arrives: the answer, older
    # than that event, must not bring the card back.
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        kept, gone = s.confirmed(2)
        held: list[tuple[Any, Any]] = []

        def hold(route: Any) -> None:
            if held:
                route.continue_()
                return
            answer = route.fetch()  # the server has answered: the listing is as it was
            with s.api.client(s.key) as c:
                assert c.delete(f"/v1/files/{gone['id']}").status_code == 202
            held.append((route, answer))

        page = chromium.page(s.api.url)
        page.route("**/v1/files?*", hold)
        page.get_by_test_id("key-input").fill(s.key)
        page.get_by_test_id("key-save").click()
        # open, then the delete's status event, while the listing's answer is held.
        page.wait_for_function("() => window.darkroomStats.events >= 2", timeout=30_000)
        route, answer = held[0]
        route.fulfill(response=answer)
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(1, timeout=15_000)
        expect(cards.first).to_have_attribute("data-id", kept["id"])


def test_a_re_read_shows_cards_added_above_in_place_and_asks_for_each_other_card_alone(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # Cards added from elsewhere push the shown ones down the listing: a re-read reads on
    # until it is past every card it shows, shows the new ones in their place, and asks
    # for no card alone that the listing held.
    with served(db_url, tmp_path, chromium) as s:
        first = s.confirmed(3)
        page = s.page(shown=3)
        added = s.confirmed(2)
        singles: list[str] = []
        page.on("request", lambda r: singles.append(r.url)
                if "/v1/files/" in r.url and "?" not in r.url else None)
        s.reread(page)
        cards = page.get_by_test_id("card")
        shown = [cards.nth(i).get_attribute("data-id") for i in range(cards.count())]
        assert shown == [a["id"] for a in reversed(added)] + [f["id"] for f in reversed(first)]
        assert singles == []


def test_a_card_deleted_on_the_page_while_a_re_read_is_on_its_way_does_not_come_back(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        made = s.confirmed(3)
        page = s.page(shown=3)
        held: list[tuple[Any, Any]] = []

        def hold(route: Any) -> None:
            held.append((route, route.fetch()))  # the listing as it was before the delete

        page.route("**/v1/files?*", hold)
        rereads = page.evaluate("() => window.darkroomStats.rereads")
        with page.expect_request("**/v1/files?*"):
            s.resync()
        page.evaluate(_ADDED)
        page.locator(f'[data-id="{made[1]["id"]}"]').get_by_test_id("delete").click()
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(2, timeout=10_000)
        route, answer = held[0]
        with page.expect_response("**/v1/files?*"):
            route.fulfill(response=answer)
        page.unroute("**/v1/files?*")
        # The re-read ends (its listing drawn, its lookups answered): nothing came back.
        page.wait_for_function(f"() => window.darkroomStats.rereads > {rereads}",
                               timeout=10_000)
        expect(cards).to_have_count(2)
        assert page.evaluate("() => window.__added") == 0


def test_a_re_read_leaves_the_pages_own_upload_as_the_upload_shows_it(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        photo = tmp_path / "up.jpg"
        photo.write_bytes(JPEG)
        page = s.page(shown=0)
        held: list[Any] = []
        cut: list[bool] = []

        def transfer(route: Any) -> None:
            if cut:  # the network gone: this try and the upload's own retries fail
                route.abort("connectionreset")
            else:
                held.append(route)

        page.route("**/v1/files/*/content", transfer)
        page.get_by_test_id("file-input").set_input_files([str(photo)])
        card = page.get_by_test_id("card").first
        expect(card).to_have_attribute("data-status", "uploading", timeout=10_000)
        # The listing holds the card as pending: the upload's own state stays shown.
        s.reread(page)
        expect(card).to_have_attribute("data-status", "uploading")
        cut.append(True)
        held[0].abort("connectionreset")
        expect(card).to_have_attribute("data-status", "failed", timeout=60_000)
        message = card.get_by_test_id("error").inner_text()
        assert message
        s.reread(page)
        expect(card).to_have_attribute("data-status", "failed")
        assert card.get_by_test_id("error").inner_text() == message


def test_re_reads_that_fail_are_tried_again_by_one_timer(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # While the listing fails, each resync's re-read fails at once; they are tried again
    # together, not each on a timer of its own (which piled up with every resync).
    with served(db_url, tmp_path, chromium) as s:
        page = chromium.browser.new_page()
        page.clock.install()
        page.goto(s.api.url)
        page.get_by_test_id("key-input").fill(s.key)
        page.get_by_test_id("key-save").click()
        page.wait_for_function("() => window.darkroomStats.events >= 1", timeout=30_000)
        listings: list[str] = []

        def failing(route: Any) -> None:
            listings.append(route.request.url)
            route.fulfill(status=503, body="")

        page.route("**/v1/files?*", failing)
        for _ in range(4):
            s.reread(page)
        assert len(listings) == 4
        page.clock.run_for(6_000)
        page.wait_for_function("() => window.darkroomStats.rereads >= 5", timeout=10_000)
        page.clock.run_for(1_000)
        assert len(listings) == 5


def test_a_card_read_on_its_way_when_the_view_changes_stays_out_of_the_new_view(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        [card] = s.confirmed(1)
        page = s.page(shown=1)
        held: list[Any] = []
        page.route(f"**/v1/files/{card['id']}", lambda route: held.append(route))
        reads = page.evaluate("() => window.darkroomStats.cardReads")
        # Ready: the page reads the card for its result; that read is held.
        worker = threading.Thread(target=s.ready, args=(card,))
        worker.start()
        worker.join(30)
        page.wait_for_function("() => window.darkroomStats.events >= 3", timeout=30_000)
        # The view changes to the queued cards: none.
        page.get_by_test_id("status-filter").select_option("queued")
        page.wait_for_function("() => window.darkroomStats.pages >= 2", timeout=10_000)
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(0)
        held[0].continue_()
        page.wait_for_function(f"() => window.darkroomStats.cardReads > {reads}",
                               timeout=10_000)
        expect(cards).to_have_count(0)


def test_a_re_read_after_more_cards_were_added_than_it_reads_shows_the_grid_anew(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        s.confirmed(3)
        page = s.page(shown=3)
        # More than the re-read's pages hold (the one loaded and three more).
        s.confirmed(401)
        with s.api.client(s.key) as c:
            newest = c.get("/v1/files?limit=1").json()["items"][0]["id"]
        s.reread(page)
        cards = page.get_by_test_id("card")
        expect(cards.first).to_have_attribute("data-id", newest, timeout=15_000)
        expect(cards).to_have_count(100)


def test_a_card_back_in_its_view_is_looked_for_again(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        [card] = s.confirmed(1)
        s.ready(card)
        page = s.page(shown=1)
        page.get_by_test_id("status-filter").select_option("ready")
        cards = page.get_by_test_id("card")
        expect(cards).to_have_count(1, timeout=10_000)
        moved = card["id"]
        s.reread(page, lambda: s.unnoticed("set_status_unnoticed", id=moved, status="queued"))
        expect(cards.first).to_have_attribute("data-status", "queued")  # out of the view
        s.reread(page, lambda: s.unnoticed("set_status_unnoticed", id=moved, status="ready"))
        expect(cards.first).to_have_attribute("data-status", "ready")  # back in it
        s.reread(page, lambda: s.unnoticed("delete_card_unnoticed", id=moved))
        expect(cards).to_have_count(0, timeout=15_000)


def test_a_re_read_keeps_the_listings_order_of_cards_made_in_one_millisecond(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    # The listing orders by created_at to the microsecond, then id: the last card shown
    # and the first one after it, in one millisecond, the later one with the smaller id.
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        made = s.confirmed(101)
        last, after = sorted((made[0]["id"], made[1]["id"]))
        with psycopg.connect(s.api.db_url, autocommit=True) as conn:
            row = conn.execute(SQL["first_created_at"]).fetchone()
            assert row is not None
            oldest = row[0] - timedelta(seconds=1)
            for card, micros in ((last, 5), (after, 1)):
                conn.execute(SQL["set_created_at"],
                             {"id": card, "at": oldest + timedelta(microseconds=micros)})
        page = s.page(shown=100)
        cards = page.get_by_test_id("card")
        expect(cards.nth(99)).to_have_attribute("data-id", last)
        s.reread(page)
        expect(cards).to_have_count(100)
        expect(cards.nth(99)).to_have_attribute("data-id", last)


def test_a_grid_read_anew_keeps_the_pages_own_upload_and_shows_the_newest_cards(
        db_url: str, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    with served(db_url, tmp_path, chromium) as s:
        s.confirmed(3)
        photo = tmp_path / "up.jpg"
        photo.write_bytes(JPEG)
        page = s.page(shown=3)
        page.route("**/v1/files/*/content", lambda route: None)  # the upload stays under way
        page.get_by_test_id("file-input").set_input_files([str(photo)])
        cards = page.get_by_test_id("card")
        expect(cards.first).to_have_attribute("data-status", "uploading", timeout=10_000)
        # More than a re-read's pages hold: the grid is read anew around the upload.
        s.confirmed(401)
        with s.api.client(s.key) as c:
            newest = [card["id"] for card in c.get("/v1/files?limit=100").json()["items"]]
        s.reread(page)
        expect(cards).to_have_count(101, timeout=15_000)
        expect(cards.first).to_have_attribute("data-status", "uploading")
        # Under it, the listing's first page, in its order.
        assert [cards.nth(i).get_attribute("data-id") for i in range(1, 101)] == newest
