"""The page holding a real archive, in headless Chromium: 2,000 cards of one owner.

Cards are made through the lease protocol itself (create, confirm, claim, complete or
fail), with real derivatives of the corpus photos. The test asserts outcomes and order,
never durations (first paint in time is bench/page.py's): the first screen is one page
of the listing and only the thumbs near the viewport; scrolling pages through all 2,000
with the cursor; an idle minute (the page's own clock, fast-forwarded) costs no request;
a status change arrives pushed; no badge or button ever leaves its card; the viewer shows
a card's details and its error.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.api.conftest import Api, start_api
from tests.support.archive import CARDS, FIRST_SCREEN_DONE, fill, finish
from tests.support.browser import Chromium

pytestmark = pytest.mark.browser


@dataclass
class Archive:
    api: Api
    key: str
    last: uuid.UUID  # the newest card, left queued: the top of the grid


@pytest.fixture
def archive(db_url: str, tmp_path: Path) -> Iterator[Archive]:
    server, api = start_api(db_url, (tmp_path / "objects").as_uri(), tmp_path, "local")
    try:
        owner = "archive"
        last = asyncio.run(fill(api.db_url, api.store, owner))
        yield Archive(api, api.make_key(owner), last)
    finally:
        server.stop()


IN_BOX = """() => {
  const out = { cards: 0, outside: [], ellipsized: 0 };
  for (const card of document.querySelectorAll('[data-testid="card"]')) {
    out.cards += 1;
    const box = card.getBoundingClientRect();
    for (const sel of ['[data-testid="status"]', '[data-testid="delete"]']) {
      const r = card.querySelector(sel).getBoundingClientRect();
      if (r.width === 0 || r.left < box.left - 0.5 || r.right > box.right + 0.5
          || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
        out.outside.push(card.dataset.id + " " + sel);
      }
    }
    const name = card.querySelector('[data-testid="filename"]');
    if (name.scrollWidth > name.clientWidth) out.ellipsized += 1;
  }
  return out;
}"""

def test_two_thousand_cards(archive: Archive, tmp_path: Path, chromium: Chromium) -> None:
    expect = chromium.expect
    shots = Path(os.environ.get("DARKROOM_SCREENSHOTS", str(tmp_path)))
    api = archive.api

    page = chromium.page(width=1280, height=900)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    # What a failed wait reports: requests still open, and what the page complained of.
    ended: list[str] = []
    page.on("requestfinished", lambda r: ended.append(r.url))
    page.on("requestfailed", lambda r: ended.append(r.url))
    complaints: list[str] = []
    page.on("pageerror", lambda e: complaints.append(str(e)))
    page.on("console", lambda m: complaints.append(m.text) if m.type == "error" else None)
    # The page's own timers run on this clock, so a minute passes without waiting.
    page.clock.install()
    page.add_init_script(
        f"localStorage.setItem('darkroom.apiKey', {json.dumps(archive.key)})")
    page.goto(api.url)
    cards = page.get_by_test_id("card")
    page.wait_for_function(FIRST_SCREEN_DONE, timeout=30_000)

    # The first screen: one page of the listing, thumbs only, only those near view.
    assert page.evaluate("window.darkroomStats.pages") == 1
    expect(cards).to_have_count(100)
    thumbs = [u for u in requests if u.endswith("/derivative?size=thumb")]
    previews = [u for u in requests if u.endswith("/derivative")]
    assert 0 < len(thumbs) < 60 and previews == []
    assert sum("/v1/files?" in u for u in requests) == 1
    assert sum(u.endswith("/v1/events") for u in requests) == 1
    # Every ready card of the page paints its thumbhash, fetched thumb or not.
    hashed = page.evaluate(
        "document.querySelectorAll('[data-status=\"ready\"] .placeholder.hashed canvas')"
        ".length")
    assert hashed == page.evaluate(
        "document.querySelectorAll('[data-testid=\"card\"][data-status=\"ready\"]')"
        ".length") > 50
    page.screenshot(path=str(shots / "page-grid.png"))

    # An idle minute on the page's clock: a handful of requests at most, none per card.
    idle_from = len(requests)
    page.clock.run_for(60_000)
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r(null)))")
    idle = requests[idle_from:]
    assert len(idle) <= 3, idle

    # A status change is pushed: the newest card (queued, at the top) ends ready.
    top = cards.first
    expect(top).to_have_attribute("data-id", str(archive.last))
    expect(top).to_have_attribute("data-status", "queued")
    # Playwright's sync API holds this thread's event loop: the worker's part runs
    # on a thread of its own.
    with ThreadPoolExecutor(1) as worker:
        worker.submit(asyncio.run, finish(api.db_url, api.store, archive.last)).result()
    expect(top).to_have_attribute("data-status", "ready", timeout=20_000)
    expect(top.get_by_test_id("preview")).to_be_visible(timeout=20_000)

    # Scrolling pages through the whole archive with the cursor.
    more = page.get_by_test_id("more")
    while not more.is_hidden():
        pages = page.evaluate("window.darkroomStats.pages")
        more.scroll_into_view_if_needed()
        page.wait_for_function(f"() => window.darkroomStats.pages > {pages}",
                               timeout=30_000)
    expect(cards).to_have_count(CARDS)
    assert page.evaluate("window.darkroomStats.pages") == CARDS // 100
    # Thumbs only for the cards scrolled near, each once: not one per card listed.
    thumbs = [u for u in requests if u.endswith("/derivative?size=thumb")]
    assert len(thumbs) == len(set(thumbs)) < CARDS // 2

    # No badge or button outside its card, long names ellipsized, at two widths.
    for width in (1280, 420):
        page.set_viewport_size({"width": width, "height": 900})
        report = page.evaluate(IN_BOX)
        assert report["cards"] == CARDS
        assert report["outside"] == []
        assert report["ellipsized"] >= CARDS // 10

    # The viewer: a rejected card's details and error, then a ready one's preview.
    page.set_viewport_size({"width": 1280, "height": 900})
    page.evaluate("window.scrollTo(0, 0)")
    rejected = page.locator('[data-testid="card"][data-status="rejected"]').first
    rejected.get_by_test_id("filename").click()
    viewer = page.get_by_test_id("viewer")
    expect(viewer).to_be_visible()
    error = viewer.get_by_test_id("viewer-error")
    expect(error).to_be_visible()
    assert "damaged" in error.inner_text()
    expect(viewer.get_by_test_id("viewer-details")).to_contain_text("Attempts")
    viewer.get_by_test_id("viewer-close").click()
    expect(viewer).to_be_hidden()
    ready = page.locator('[data-testid="card"][data-status="ready"]').nth(1)
    ready.locator(".thumb").click()
    image = viewer.get_by_test_id("viewer-image")
    try:
        expect(image).to_be_visible(timeout=30_000)
    except AssertionError as e:
        open_now = Counter(requests) - Counter(ended)
        raise AssertionError(
            f"no preview: {sum(open_now.values())} requests open "
            f"({sum(n for u, n in open_now.items() if u.endswith('=thumb'))} thumbs, "
            f"preview {any(u.endswith('/derivative') for u in open_now)}); "
            f"page errors: {complaints[-5:]}") from e
    assert any(u.endswith("/derivative") for u in requests)  # the preview, on click
    page.screenshot(path=str(shots / "page-viewer.png"))
    viewer.get_by_test_id("viewer-close").click()

    # The status filter: a fresh listing of that status only.
    page.get_by_test_id("status-filter").select_option("rejected")
    expect(cards.first).to_have_attribute("data-status", "rejected", timeout=20_000)
    statuses = page.evaluate(
        "[...document.querySelectorAll('[data-testid=\"card\"]')]"
        ".map((c) => c.dataset.status)")
    assert 0 < len(statuses) <= 100 and set(statuses) == {"rejected"}
