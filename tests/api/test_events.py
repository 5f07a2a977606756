"""GET /v1/events: status changes pushed per owner, fed by the queue's notifications."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from darkroom.api.events import Hub
from darkroom.db.database import Database
from darkroom.watch import Watch
from tests.api.conftest import Api, start_api
from tests.api.helpers import JPEG, assert_problem, confirmed, make_ready, upload
from tests.support.services import wait_until
from tests.support.sql import SQL

WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L" + b"\x01" * 14


class Stream:
    """One page's event stream, read by a thread into a queue (no sleeps: get waits)."""

    def __init__(self, api: Api, key: str) -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._client = httpx.Client(base_url=api.url, timeout=httpx.Timeout(30, read=None))
        self._request = self._client.build_request(
            "GET", "/v1/events", headers={"Authorization": f"Bearer {key}"})
        self._response = self._client.send(self._request, stream=True)
        assert self._response.status_code == 200
        assert self._response.headers["content-type"].startswith("text/event-stream")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.next()[0] == "open"

    def _read(self) -> None:
        kind, data = "message", ""
        try:
            for line in self._response.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                elif line == "" and data:
                    self.events.put((kind, json.loads(data)))
                    kind, data = "message", ""
        except httpx.HTTPError:
            pass
        self.events.put(("closed", {}))

    def next(self, skip_pings: bool = True) -> tuple[str, dict[str, Any]]:
        while True:
            event = self.events.get(timeout=20)
            if not (skip_pings and event[0] == "ping"):
                return event

    def close(self) -> None:
        # The reader thread ends when the server ends the stream (at the latest when the
        # fixture stops the server): closing a socket under a blocked read does not wake it.
        self._response.close()
        self._client.close()


@contextmanager
def stream(api: Api, key: str) -> Iterator[Stream]:
    s = Stream(api, key)
    try:
        yield s
    finally:
        s.close()


def test_events_need_a_key(local_api: Api) -> None:
    with local_api.client(None) as c:
        assert_problem(c.get("/v1/events"), 401, "unauthorized")


def test_each_owner_sees_only_its_own_changes_in_order(local_api: Api) -> None:
    alice, bob = local_api.make_key("alice"), local_api.make_key("bob")
    with stream(local_api, alice) as a, stream(local_api, bob) as b, \
            local_api.client(alice) as ca, local_api.client(bob) as cb:
        # Confirming is not pushed: the page that confirms shows the answer it got.
        theirs = confirmed(cb)
        mine = confirmed(ca)
        # The worker's side of the protocol: claim (processing), then the fenced commit.
        make_ready(local_api.db_url, local_api.settings, local_api.store, mine["id"], WEBP)
        assert a.next() == ("status", {"type": "status", "id": mine["id"],
                                       "status": "processing"})
        assert a.next()[1] == {"type": "status", "id": mine["id"], "status": "ready"}
        # make_ready claimed bob's card too and handed it back: bob hears of his own only.
        assert [b.next()[1] for _ in range(2)] == [
            {"type": "status", "id": theirs["id"], "status": "processing"},
            {"type": "status", "id": theirs["id"], "status": "queued"},
        ]
        ca.delete(f"/v1/files/{mine['id']}")
        assert a.next()[1] == {"type": "status", "id": mine["id"], "status": "deleting"}


def test_idle_stream_only_pings_and_ends_at_shutdown(db_url: str, tmp_path: Path) -> None:
    server, api = start_api(db_url, (tmp_path / "o").as_uri(), tmp_path, "local",
                            events_ping_seconds=0.2)
    try:
        key = api.make_key("carol")
        with stream(api, key) as s, api.client(key) as c:
            assert [s.next(skip_pings=False)[0] for _ in range(3)] == ["ping"] * 3
            card, version = upload(c, JPEG)  # a new pending card is no status change
            assert s.next(skip_pings=False)[0] == "ping"
            c.post(f"/v1/files/{card['id']}/confirm", json={"version": version})
            make_ready(api.db_url, api.settings, api.store, card["id"], WEBP)
            assert [s.next()[1]["status"] for _ in range(2)] == ["processing", "ready"]
            server.stop()
            assert s.next() == ("closed", {})
    finally:
        server.stop()


async def test_open_pages_are_told_to_re_read_once_a_lapsed_watch_is_back(pool: Any) -> None:
    # The hub alone (no HTTP): its watch's clock is the test's.
    db = Database(pool)
    now = [0.0]
    hub = Hub(db, ping_seconds=60, watch=Watch(db, clock=lambda: now[0]))
    try:
        alice = await hub.subscribe("alice")
        assert hub.watch.is_on() and alice.empty()
        # The watch's reckoned end passes unextended (say the database was out of reach):
        # changes meanwhile may have gone unnotified.
        now[0] += 1000
        await hub.subscribe("bob")  # wakes the hub's keeper of the watch
        assert await asyncio.wait_for(alice.get(), 20) == {"type": "resync"}
        assert hub.watch.is_on()
    finally:
        hub.close()


async def test_a_page_gone_before_its_stream_opened_keeps_no_place(pool: Any) -> None:
    # Its stream waits for the notices to be complete (here, for a change that read the
    # watch as off, which may take as long as a VACUUM); the page leaves meanwhile. It must
    # not stay counted as open, or the watch would be kept on for nobody, for ever.
    db = Database(pool)
    hub = Hub(db, ping_seconds=60)
    try:
        async with db.transaction() as tx:
            # A status change in progress (it changes no card, but holds its lock).
            await tx.rows("revoke", {"id": uuid.uuid4(), "owner": "nobody"})
            opening = asyncio.create_task(hub.subscribe("alice"))
            await wait_until(lambda: opening.done() or hub.watch.waiting_for > 0,
                             what="the stream to wait")
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
            assert hub.streams == 0
            # Nor does the hub wait on, keeping the watch on, for a page no longer there.
            await wait_until(lambda: hub.watch.waiting_for == 0,
                             what="the hub to stop waiting")
    finally:
        hub.close()


async def test_a_notice_not_of_darkrooms_shape_silences_no_stream(pool: Any, db_url: str) -> None:
    # Whoever reaches the database can NOTIFY the pages' channel: what is not one of
    # darkroom_notify_cards' shapes is passed over, and the next change still arrives.
    db = Database(pool)
    hub = Hub(db, ping_seconds=60)
    try:
        alice = await hub.subscribe("alice")
        with psycopg.connect(db_url, autocommit=True) as conn:
            for junk in ('{"c": 1}', "[1]", '{"c": [[1, 2]]}', '{"o": 7}', "not json"):
                conn.execute(SQL["notify_cards_channel"], {"payload": junk})
            conn.execute(SQL["notify_cards_channel"],
                         {"payload": '{"c": [["alice", "a1", "queued"]]}'})
        assert await asyncio.wait_for(alice.get(), 20) == {
            "type": "status", "id": "a1", "status": "queued"}
    finally:
        hub.close()


async def test_a_list_too_long_for_a_notice_sends_its_owners_pages_alone_to_re_read(
        pool: Any, db_url: str) -> None:
    db = Database(pool)
    hub = Hub(db, ping_seconds=60)
    try:
        alice, bob = await hub.subscribe("alice"), await hub.subscribe("bob")
        changed = json.dumps([["alice", str(uuid.uuid4()), "queued"] for _ in range(400)])
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(SQL["notify_cards"], {"changed": changed})
            conn.execute(SQL["notify_cards"], {"changed": json.dumps([["bob", "b1", "ready"]])})
        assert await asyncio.wait_for(alice.get(), 20) == {"type": "resync"}
        # Bob's page hears of its own change only: nothing of alice's long list.
        assert await asyncio.wait_for(bob.get(), 20) == {
            "type": "status", "id": "b1", "status": "ready"}
    finally:
        hub.close()
