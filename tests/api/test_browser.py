"""The web page in real headless Chromium (Debian's, driven by Playwright), against the
real API and a real `darkroom worker` process: upload a photo and a broken file, watch one
become ready with its preview and the other rejected in words, delete one."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from darkroom.layout import original_key
from tests.api.conftest import Api
from tests.support.browser import Chromium
from tests.support.faults import FaultProxy
from tests.support.services import CORPUS
from tests.support.sql import SQL

pytestmark = pytest.mark.browser

SCREENSHOT = Path("/tmp/darkroom-page.png")
PHOTO = CORPUS / "Dune.jpg"


def test_upload_watch_view_and_delete(
    page_api: Api, worker_process: subprocess.Popen[bytes], tmp_path: Path, chromium: Chromium
) -> None:
    expect = chromium.expect

    api = page_api
    key = api.make_key("browser", admin=True)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"this is not an image, only a hundred bytes of plain text. " * 2)

    page = chromium.page(api.url, key)
    expect(page.get_by_test_id("key-set")).to_be_visible()
    expect(page.get_by_test_id("queue-panel")).to_be_visible(timeout=10_000)
    # Another owner's bulk card, not due for an hour (so no worker takes it): the
    # panel shows the backlog per priority and the owner among the top owners.
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        waiting = uuid.uuid4()
        conn.execute(SQL["seed_later_bulk"], {
            "id": waiting, "owner": "importer",
            "key": original_key(waiting, "importer")})
    expect(page.get_by_test_id("q-bulk")).to_have_text(re.compile(r"^1\b"),
                                                       timeout=10_000)
    owners = page.get_by_test_id("q-owners")
    expect(owners.locator('tr[data-owner="importer"] td').nth(3)).to_have_text("1")

    page.get_by_test_id("file-input").set_input_files([str(PHOTO), str(broken)])

    cards = page.get_by_test_id("card")
    photo = cards.filter(has_text="Dune.jpg")
    bad = cards.filter(has_text="broken.jpg")
    # First any final state (so a failure shows at once), then the right one.
    final = re.compile(r"^(ready|rejected|failed)$")
    expect(photo).to_have_attribute("data-status", final, timeout=90_000)
    expect(photo).to_have_attribute("data-status", "ready", timeout=1)
    preview = photo.get_by_test_id("preview")
    expect(preview).to_be_visible(timeout=20_000)
    # Polls in the browser until the WebP has decoded, with Playwright's deadline.
    page.wait_for_function(
        "el => el.complete && el.naturalWidth > 0",
        arg=preview.element_handle(),
        timeout=20_000,
    )

    expect(bad).to_have_attribute("data-status", final, timeout=90_000)
    expect(bad).to_have_attribute("data-status", "rejected", timeout=1)
    error = bad.get_by_test_id("error")
    expect(error).to_be_visible()
    text = error.inner_text()
    assert "image" in text and "_" not in text  # a sentence, not a code

    expect(page.get_by_test_id("q-ready")).to_have_text("1", timeout=10_000)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    bad_id = bad.get_attribute("data-id")
    bad.get_by_test_id("delete").click()
    expect(bad).to_have_count(0)
    expect(cards).to_have_count(1)

    with api.client(key) as c:
        assert c.get(f"/v1/files/{bad_id}").status_code == 404
        items = c.get("/v1/files").json()["items"]
        assert [i["filename"] for i in items] == ["Dune.jpg"]
        assert items[0]["status"] == "ready"
    assert httpx.get(f"{api.url}/healthz").status_code == 200


def test_page_says_already_there_and_retries_a_lost_create_with_the_same_key(
    page_api: Api, tmp_path: Path, chromium: Chromium
) -> None:
    """Through a proxy that loses the answer to one create: the page retries it with the
    same Idempotency-Key (one card), and a photo dropped again is reported as already in
    the archive instead of being uploaded twice."""
    expect = chromium.expect

    api = page_api
    key = api.make_key("browser-again")
    port = int(api.url.rsplit(":", 1)[1])
    with FaultProxy(("127.0.0.1", port)) as proxy:
        page = chromium.page(f"http://{proxy.url_host()}", key)
        expect(page.get_by_test_id("key-set")).to_be_visible()

        proxy.cut_answers(1, request_prefix=b"POST /v1/files ")
        page.get_by_test_id("file-input").set_input_files([str(PHOTO)])
        cards = page.get_by_test_id("card")
        photo = cards.filter(has_text="Dune.jpg")
        # No worker runs: queued is as far as the card goes.
        expect(photo).to_have_attribute("data-status", "queued", timeout=60_000)
        assert proxy.counters.cut_after == 1
        expect(cards).to_have_count(1)

        page.get_by_test_id("file-input").set_input_files([str(PHOTO)])
        note = photo.get_by_test_id("note")
        expect(note).to_be_visible(timeout=30_000)
        expect(note).to_contain_text("already in your archive")
        expect(cards).to_have_count(1)

    with api.client(key) as c:
        items = c.get("/v1/files").json()["items"]
    assert [(i["filename"], i["status"]) for i in items] == [("Dune.jpg", "queued")]


def test_many_files_with_overall_progress_and_refusals_in_words(
    page_api: Api, worker_process: subprocess.Popen[bytes], tmp_path: Path, chromium: Chromium
) -> None:
    expect = chromium.expect
    from tests.derive import images as im

    api = page_api
    key = api.make_key("uploader")
    phone = tmp_path / "IMG_0001.heic"
    phone.write_bytes(im.heic(im.quadrants(1200, 900)))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a photo\n")
    huge = tmp_path / "huge.jpg"
    huge.write_bytes(b"\xff\xd8\xff" + b"\0" * api.settings.max_upload_bytes)

    page = chromium.page(height=900)
    # The first upload of the photo's bytes is cut off, as a dropped connection
    # would; every later one goes through.
    cut: list[str] = []
    photo_ids: list[str] = []

    def created(route: Any) -> None:
        answer = route.fetch()
        if answer.status == 201 and answer.json()["filename"] == PHOTO.name:
            photo_ids.append(answer.json()["id"])
        route.fulfill(response=answer)

    def once(route: Any) -> None:
        if not cut and photo_ids and photo_ids[0] in route.request.url:
            cut.append(route.request.url)
            route.abort("connectionreset")
        else:
            route.continue_()

    page.route("**/v1/files", created)
    page.route("**/v1/files/*/content", once)
    page.goto(api.url)
    page.get_by_test_id("key-input").fill(key)
    page.get_by_test_id("key-save").click()
    page.get_by_test_id("file-input").set_input_files(
        [str(PHOTO), str(phone), str(notes), str(huge)])

    overall = page.get_by_test_id("upload-progress")
    expect(overall).to_contain_text("Uploaded 4 files", timeout=60_000)

    cards = page.get_by_test_id("card")
    text = cards.filter(has_text="notes.txt")
    expect(text).to_have_attribute("data-status", "failed")
    expect(text.get_by_test_id("error")).to_contain_text("JPEG, PNG, WebP, GIF, HEIC")
    expect(text.get_by_test_id("retry")).to_be_hidden()
    big = cards.filter(has_text="huge.jpg")
    expect(big.get_by_test_id("error")).to_contain_text("larger than the upload limit")
    expect(big.get_by_test_id("retry")).to_be_hidden()

    heic = cards.filter(has_text="IMG_0001.heic")
    expect(heic).to_have_attribute("data-status", "ready", timeout=90_000)

    # The cut upload was sent again by the page itself, to the same card.
    assert len(cut) == 1
    expect(cards.filter(has_text="Dune.jpg")).to_have_count(1)
    expect(cards.filter(has_text="Dune.jpg")).to_have_attribute(
        "data-status", "ready", timeout=90_000)

    with api.client(key) as c:
        items = c.get("/v1/files").json()["items"]
        assert sorted(i["filename"] for i in items) == ["Dune.jpg", "IMG_0001.heic"]
        assert {i["status"] for i in items} == {"ready"}


def test_console_for_an_admin_history_rejected_by_code_pause_and_resume(
    page_api: Api, chromium: Chromium
) -> None:
    """An admin's page: the rejected files by code across owners, a file's history in the
    viewer, pause and resume; an owner's key sees none of it, and only its own files."""
    expect = chromium.expect
    from darkroom.errors import ErrorCode
    from tests.api.helpers import confirmed
    from tests.api.test_console import fail_all

    api = page_api
    root, alice, bob = (api.make_key("root", admin=True), api.make_key("alice"),
                        api.make_key("bob"))
    with api.client(alice) as c:
        mine = confirmed(c, filename="alice.jpg")
    with api.client(bob) as c:
        confirmed(c, filename="bob.jpg")
    fail_all(api, [ErrorCode.INVALID_IMAGE], worker="w-9")
    with api.client(bob) as c:
        confirmed(c, filename="bob-big.jpg")
    fail_all(api, [ErrorCode.IMAGE_TOO_LARGE], worker="w-9")

    page = chromium.page(api.url, root, height=900)
    expect(page.get_by_test_id("queue-panel")).to_be_visible(timeout=10_000)
    expect(page.get_by_test_id("q-claiming")).to_have_text("running")
    codes = page.get_by_test_id("q-code")
    expect(codes).to_have_text(["invalid_image · 2", "image_too_large · 1"])  # most first

    # Every owner's files rejected with one code, in the grid.
    codes.filter(has_text="invalid_image").click()
    expect(page.get_by_test_id("code-filter")).to_contain_text("invalid_image")
    cards = page.get_by_test_id("card")
    expect(cards).to_have_count(2)
    expect(cards.filter(has_text="alice.jpg")).to_have_attribute("data-status",
                                                                 "rejected")
    expect(cards.filter(has_text="bob.jpg")).to_have_count(1)
    expect(cards.first.get_by_test_id("delete")).to_be_hidden()

    # The viewer's timeline: the attempt, its code, how long it took, the worker.
    cards.filter(has_text="alice.jpg").get_by_test_id("filename").click()
    steps = page.get_by_test_id("viewer-history").locator("li")
    expect(steps).to_have_count(2)
    assert [steps.nth(i).get_attribute("data-kind") for i in range(2)] == [
        "claimed", "rejected"]
    expect(steps.nth(1)).to_contain_text("attempt 1")
    expect(steps.nth(1)).to_contain_text("invalid_image")
    expect(steps.nth(1)).to_contain_text("took")
    expect(steps.nth(1)).to_contain_text("w-9")
    expect(page.get_by_test_id("viewer-delete")).to_be_hidden()
    page.screenshot(path="/tmp/darkroom-console.png", full_page=True)
    page.get_by_test_id("viewer-close").click()

    # Pause one owner's files, then resume.
    page.get_by_test_id("q-pause-owner").fill("bob")
    page.get_by_test_id("q-pause").click()
    paused = page.locator('[data-testid="q-pauses"] li[data-owner="bob"]')
    expect(paused).to_contain_text("owner bob", timeout=10_000)
    expect(paused).to_contain_text("api:root")
    expect(page.get_by_test_id("q-claiming")).to_have_text("paused")
    page.get_by_test_id("queue-panel").screenshot(path="/tmp/darkroom-console-paused.png")
    with api.client(root) as c:
        assert [(x["owner"], x["priority"], x["paused_by"]) for x in
                c.get("/v1/queue").json()["claim_pauses"]] == [
            ("bob", None, "api:root")]
    paused.get_by_test_id("q-resume").click()
    expect(paused).to_have_count(0, timeout=10_000)
    expect(page.get_by_test_id("q-claiming")).to_have_text("running")
    expect(page.get_by_test_id("q-pause-log")).to_contain_text(
        "Last: resumed owner bob by api:root")

    page.get_by_test_id("code-filter-clear").click()
    expect(page.get_by_test_id("code-filter")).to_be_hidden()
    expect(cards).to_have_count(0)  # the admin's own files: none

    # An owner's key: no console, only its own file, no worker names.
    page.get_by_test_id("key-forget").click()
    page.get_by_test_id("key-input").fill(alice)
    page.get_by_test_id("key-save").click()
    expect(cards).to_have_count(1, timeout=10_000)
    expect(cards.first).to_contain_text("alice.jpg")
    expect(page.get_by_test_id("queue-panel")).to_be_hidden()
    cards.first.get_by_test_id("filename").click()
    expect(steps).to_have_count(2)
    expect(steps.nth(1)).to_contain_text("invalid_image")
    expect(steps.nth(1)).not_to_contain_text("w-9")

    with psycopg.connect(api.db_url) as conn:
        log = conn.execute(SQL["claim_pause_log"]).fetchall()
    assert log == [("paused", "bob", "api:root"), ("resumed", "bob", "api:root")]
    with api.client(alice) as c:
        assert c.get(f"/v1/files/{mine['id']}").json()["status"] == "rejected"


def test_a_card_rejected_for_a_passing_fault_has_a_retry_button(
    page_api: Api, tmp_path: Path, chromium: Chromium
) -> None:
    """Rejected for a storage outage: Retry queues it again from the page. Rejected for
    its own bytes: no Retry."""
    expect = chromium.expect
    from darkroom.errors import ErrorCode
    from tests.api.helpers import confirmed
    from tests.api.test_retry_route import reject

    api = page_api
    key = api.make_key("retrier")
    with api.client(key) as c:
        outage = confirmed(c, PHOTO.read_bytes(), filename="outage.jpg")
        reject(api, outage["id"], ErrorCode.STORAGE_UNAVAILABLE)
        corrupt = confirmed(c, PHOTO.read_bytes()[:5000], filename="corrupt.jpg")
        reject(api, corrupt["id"], ErrorCode.INVALID_IMAGE)

    page = chromium.page(api.url, key)
    cards = page.get_by_test_id("card")
    passing = cards.filter(has_text="outage.jpg")
    own = cards.filter(has_text="corrupt.jpg")
    expect(passing).to_have_attribute("data-status", "rejected", timeout=20_000)
    expect(own).to_have_attribute("data-status", "rejected", timeout=20_000)
    expect(passing.get_by_test_id("error")).to_contain_text("Storage was unavailable")
    expect(own.get_by_test_id("retry")).to_be_hidden()
    button = passing.get_by_test_id("retry")
    expect(button).to_be_visible()
    button.click()
    # No worker runs: queued is as far as the card goes.
    expect(passing).to_have_attribute("data-status", "queued", timeout=20_000)
    expect(button).to_be_hidden()
    expect(passing.get_by_test_id("error")).to_be_hidden()
    expect(own).to_have_attribute("data-status", "rejected")

    with api.client(key) as c:
        assert c.get(f"/v1/files/{outage['id']}").json()["status"] == "queued"
        assert c.get(f"/v1/files/{corrupt['id']}").json()["status"] == "rejected"
    with psycopg.connect(api.db_url) as conn:
        [(who,)] = conn.execute(SQL["retried_by"], {"id": outage["id"]}).fetchall()
    assert who == f"api:{key[:12]} owner=retrier"


def test_an_admin_picks_rejected_cards_of_any_owner_and_retries_them(
    page_api: Api, chromium: Chromium
) -> None:
    """The console's rejected files of a retryable code: pick two of three (two owners'),
    Retry selected; those two are queued again, the third stays rejected, the panel's
    counts follow. An owner's key sees no picking."""
    expect = chromium.expect
    from darkroom.errors import ErrorCode
    from tests.api.helpers import confirmed
    from tests.api.test_retry_route import reject

    api = page_api
    root, alice, bob = (api.make_key("root", admin=True), api.make_key("alice"),
                        api.make_key("bob"))
    made: dict[str, str] = {}
    for key, name in ((alice, "a-1.jpg"), (bob, "b-1.jpg"), (bob, "b-2.jpg")):
        with api.client(key) as c:
            made[name] = confirmed(c, filename=name)["id"]
        reject(api, made[name], ErrorCode.STORAGE_UNAVAILABLE)

    page = chromium.page(api.url, root, height=900)
    codes = page.get_by_test_id("q-code")
    expect(codes).to_have_text(["storage_unavailable · 3"], timeout=10_000)
    expect(page.get_by_test_id("q-rejected")).to_have_text("3")
    codes.first.click()
    cards = page.get_by_test_id("card")
    expect(cards).to_have_count(3)
    expect(page.get_by_test_id("picking")).to_be_visible()
    expect(page.get_by_test_id("retry-shown")).to_have_text("Retry all 3 shown")
    expect(page.get_by_test_id("retry-selected")).to_be_disabled()

    cards.filter(has_text="a-1.jpg").get_by_test_id("pick").check()
    cards.filter(has_text="b-2.jpg").get_by_test_id("pick").check()
    expect(page.get_by_test_id("retry-selected")).to_have_text("Retry selected (2)")
    page.get_by_test_id("retry-selected").click()

    # No worker runs: queued is as far as the cards go.
    for name in ("a-1.jpg", "b-2.jpg"):
        card = cards.filter(has_text=name)
        expect(card).to_have_attribute("data-status", "queued", timeout=10_000)
        expect(card.get_by_test_id("pick")).to_be_hidden()
    expect(cards.filter(has_text="b-1.jpg")).to_have_attribute("data-status",
                                                                "rejected")
    expect(page.get_by_test_id("retry-result")).to_have_text("Queued 2 of 2 again.")
    expect(page.get_by_test_id("retry-shown")).to_have_text("Retry all 1 shown")
    # The panel's counts follow at once, not at its next tick.
    expect(codes).to_have_text(["storage_unavailable · 1"], timeout=5_000)
    expect(page.get_by_test_id("q-rejected")).to_have_text("1")
    expect(page.get_by_test_id("q-queued")).to_have_text("2")
    page.screenshot(path="/tmp/darkroom-console-retry.png", full_page=True)

    # An owner's key: its own rejected card, its own Retry, no picking.
    page.get_by_test_id("code-filter-clear").click()
    page.get_by_test_id("key-forget").click()
    page.get_by_test_id("key-input").fill(bob)
    page.get_by_test_id("key-save").click()
    expect(cards).to_have_count(2, timeout=10_000)
    own = cards.filter(has_text="b-1.jpg")
    expect(own).to_have_attribute("data-status", "rejected")
    expect(own.get_by_test_id("retry")).to_be_visible()
    expect(own.get_by_test_id("pick")).to_be_hidden()
    expect(page.get_by_test_id("picking")).to_be_hidden()

    with api.client(alice) as c:
        assert c.get(f"/v1/files/{made['a-1.jpg']}").json()["status"] == "queued"
    with api.client(bob) as c:
        assert [c.get(f"/v1/files/{made[n]}").json()["status"]
                for n in ("b-1.jpg", "b-2.jpg")] == ["rejected", "queued"]
    with psycopg.connect(api.db_url) as conn:
        who = conn.execute(SQL["retried_files_by"]).fetchall()
    assert who == sorted((made[n], f"api:{root[:12]} owner=root")
                         for n in ("a-1.jpg", "b-2.jpg"))
