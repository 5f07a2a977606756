"""Every client's share of the API is bounded, each against a real `darkroom api` process:
event streams per owner and in time (and apart from requests), connections per client
address, pipelined requests, a body's total time, and unknown-key lookups that never
refuse a valid key.

On Linux every 127.0.0.0/8 address routes to lo: a client socket bound to 127.0.0.2,
127.0.0.3, ... is another client address to the server.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.helpers import JPEG, assert_problem, create
from tests.api.test_facing import _api_process, _cli, _read_answer, _status
from tests.api.test_facing import harness as harness
from tests.support.services import Harness, wait_for


def _client(url: str, address: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30,
                        transport=httpx.HTTPTransport(local_address=address))


def _connect(port: int, address: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30,
                                    source_address=(address, 0))


class Events:
    """One event stream from a given client address, read by a thread into a queue."""

    def __init__(self, url: str, key: str, address: str = "127.0.0.1") -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=None),
                                    transport=httpx.HTTPTransport(local_address=address))
        request = self._client.build_request(
            "GET", "/v1/events", headers={"Authorization": f"Bearer {key}"})
        self._response = self._client.send(request, stream=True)
        assert self._response.status_code == 200, self._response.read()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next() == ("open", {})

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

    def next(self, timeout: float = 30) -> tuple[str, dict[str, Any]]:
        while True:
            event = self.events.get(timeout=timeout)
            if event[0] != "ping":
                return event

    def close(self) -> None:
        self._response.close()
        self._client.close()


@pytest.fixture
def streams() -> Iterator[list[Events]]:
    opened: list[Events] = []
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def _key(harness: Harness, owner: str) -> str:
    made = _cli(harness.db_url, harness.tmp, "keys", "create", "--owner", owner)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


# --- 1. event streams -------------------------------------------------------------------


def test_streams_are_bounded_per_owner_and_apart_from_requests(
        harness: Harness, streams: list[Events]) -> None:
    _, url = _api_process(harness, api_max_connections="4",
                          events_max_streams_per_owner="3", events_ping_seconds="0.5")
    alice, bob = _key(harness, "alice"), _key(harness, "bob")
    # Three of alice's streams, then a fourth: the oldest is told it was replaced and ends;
    # the others stay open.
    for _ in range(3):
        streams.append(Events(url, alice, "127.0.0.2"))
    streams.append(Events(url, alice, "127.0.0.2"))
    assert streams[0].next() == ("end", {"type": "end", "reason": "replaced"})
    assert streams[0].next() == ("closed", {})
    for s in streams[1:]:
        assert s.events.empty() or s.events.queue[0][0] == "ping"
    # One of bob's: four open streams, the limit of four connections, and yet every
    # request is answered, from any address. Streams have a pool of their own, of the
    # same size: a fifth is refused, and the requests are still answered.
    streams.append(Events(url, bob, "127.0.0.3"))
    with _client(url, "127.0.0.3", bob) as c:
        assert_problem(c.get("/v1/events"), 503, "over_capacity")
    assert httpx.get(f"{url}/healthz").status_code == 200
    with _client(url, "127.0.0.4", bob) as c:
        assert c.get("/v1/files").status_code == 200
    with _client(url, "127.0.0.2", alice) as c:
        assert c.get("/v1/files").status_code == 200


def test_a_stream_ends_at_its_max_age_and_when_its_key_is_revoked(
        harness: Harness, streams: list[Events]) -> None:
    _, url = _api_process(harness, events_max_seconds="2", key_cache_seconds="1",
                          events_ping_seconds="0.5")
    key = _key(harness, "alice")
    _key(harness, "alice")  # the owner's other key stays valid
    old = Events(url, key)
    streams.append(old)
    # At its max age the stream says so and ends; the page reconnects at once.
    assert old.next() == ("end", {"type": "end", "reason": "max_age"})
    assert old.next() == ("closed", {})
    # Another process, whose streams outlive the test: a revoked key's stream ends.
    _, url = _api_process(harness, key_cache_seconds="1", events_ping_seconds="0.5")
    fresh = Events(url, key)
    streams.append(fresh)
    revoked = _cli(harness.db_url, harness.tmp, "keys", "revoke", key[:12])
    assert revoked.returncode == 0, revoked.stderr
    # Revoked: the open stream ends within the key cache's time, long before its max age.
    assert fresh.next(timeout=10) == ("end", {"type": "end", "reason": "revoked"})
    assert fresh.next() == ("closed", {})
    with _client(url, "127.0.0.1", key) as c:
        assert_problem(c.get("/v1/events"), 401, "unauthorized")


# --- 2. connections per client address ------------------------------------------------


def test_connections_are_bounded_per_client_address(harness: Harness) -> None:
    proc, url = _api_process(harness, api_max_connections="10",
                             api_max_connections_per_client="4")
    port = int(url.rsplit(":", 1)[1])
    # One address opens far more idle connections than the process's whole limit.
    held = [_connect(port, "127.0.0.2") for _ in range(4)]
    extra = [_connect(port, "127.0.0.2") for _ in range(12)]
    try:
        # Past its cap, that address is answered 503 (or simply cut off) at once.
        for s in extra:
            answer = _read_answer(s)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer
        # Everyone else, and /healthz, are answered normally meanwhile.
        assert httpx.get(f"{url}/healthz").status_code == 200
        with _client(url, "127.0.0.3") as c:
            assert c.get("/healthz").status_code == 200
        # The held ones are still good connections.
        held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_answer(held[0]).startswith(b"HTTP/1.1 200")
    finally:
        for s in held + extra:
            s.close()
    # Closed, they no longer count: the address may connect again.
    with _client(url, "127.0.0.2") as c:
        wait_for(lambda: c.get("/healthz").status_code == 200, what="the address to be let in")
    assert proc.proc.poll() is None


def test_idle_connections_make_room_and_only_work_fills_the_process(harness: Harness) -> None:
    """At the process's connection limit a request takes the place of the connection idle
    the longest (closed: its client reads the end); only connections at work (an upload
    under way) make a request wait outside, answered 503."""
    _, url = _api_process(harness, api_max_connections="4")
    port = int(url.rsplit(":", 1)[1])
    key = _key(harness, "alice")
    with _client(url, "127.0.0.1", key) as c:
        cards = [create(c, size=100_000).json() for _ in range(4)]

    def uploading(card: dict[str, Any]) -> socket.socket:
        s = _connect(port, "127.0.0.1")
        s.sendall(f"PUT /v1/files/{card['id']}/content HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {key}\r\nContent-Type: image/jpeg\r\n"
                  "Content-Length: 100000\r\n\r\n".encode() + JPEG[:100])
        return s

    idle = [_connect(port, f"127.0.0.{2 + i}") for i in range(2)]  # idle the longest
    busy = [uploading(card) for card in cards[:2]]
    try:
        # Four held, two of them idle: a request is served, the idlest is closed.
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert _read_answer(idle[0]) == b""
        busy += [uploading(card) for card in cards[2:]]
        # Four at work: nothing to close, the request is answered 503.
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 503,
                 what="a 503 with every connection at work")
        assert_problem(httpx.get(f"{url}/healthz"), 503, "over_capacity")
    finally:
        for s in busy + idle:
            s.close()
    wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, what="room again")


# --- 3. pipelining ----------------------------------------------------------------------


def test_pipelined_requests_are_bounded(harness: Harness) -> None:
    proc, url = _api_process(harness)
    port = int(url.rsplit(":", 1)[1])
    httpx.get(f"{url}/healthz")
    idle = _status(proc.pid, "VmRSS")
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    flood = one * (256 * 1024 // len(one))
    answers: list[int] = []
    lock = threading.Lock()

    def attack(n: int) -> None:
        with _connect(port, f"127.0.0.{2 + n % 4}") as s:
            with contextlib.suppress(OSError):  # closed under it: as it should be
                s.sendall(flood)
            got = _read_answer(s)
            with lock:
                answers.append(got.count(b"HTTP/1.1 200"))

    threads = [threading.Thread(target=attack, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == 20
    # The one in progress and at most eight queued behind it are answered; the rest of
    # what was sent is dropped unread and the connection closed.
    assert max(answers) <= 9 and min(answers) >= 1, answers
    assert _status(proc.pid, "VmHWM") <= idle + 20 * 1024 * 1024
    assert httpx.get(f"{url}/healthz").status_code == 200


# --- 4. bodies ----------------------------------------------------------------------------


def test_a_slow_body_has_a_total_deadline(harness: Harness) -> None:
    _, url = _api_process(harness, api_read_timeout_seconds="2",
                          api_min_body_bytes_per_second="1000")
    port = int(url.rsplit(":", 1)[1])
    key = _key(harness, "alice")
    with _client(url, "127.0.0.1", key) as c:
        card = create(c, size=100_000).json()
    s = _connect(port, "127.0.0.1")
    s.sendall(f"PUT /v1/files/{card['id']}/content HTTP/1.1\r\nHost: x\r\n"
              f"Authorization: Bearer {key}\r\nContent-Type: image/jpeg\r\n"
              "Content-Length: 100000\r\n\r\n".encode())
    closed = threading.Event()

    def read() -> None:
        _read_answer(s)
        closed.set()

    threading.Thread(target=read, daemon=True).start()
    # 100 bytes a second: never a pause as long as the read timeout, but far below the
    # minimum rate. The server hangs up long before the body could be done.
    sent = 0
    for _ in range(30):
        if closed.wait(1.0):
            break
        try:
            s.sendall(JPEG[:100].ljust(100, b"\0"))
        except OSError:
            break
        sent += 100
    s.close()
    assert closed.is_set() or sent < 3_000, sent
    assert sent < 1_000, sent


# --- 5. keys --------------------------------------------------------------------------------


def _random_key() -> dict[str, str]:
    return {"Authorization": f"Bearer dk_{uuid.uuid4().hex}"}


def test_someone_elses_bad_keys_never_refuse_a_valid_key(harness: Harness) -> None:
    _, url = _api_process(harness, unknown_key_rate_per_minute="3", key_cache_seconds="0")
    bob, carol = _key(harness, "bob"), _key(harness, "carol")
    with _client(url, "127.0.0.2", bob) as c:
        assert c.get("/v1/files").status_code == 200  # bob's key is known here from now on
    stop = threading.Event()
    guessed: list[int] = []

    def guess() -> None:
        with _client(url, "127.0.0.2") as g:
            while not stop.is_set():
                guessed.append(g.get("/v1/files", headers=_random_key()).status_code)

    guesser = threading.Thread(target=guess)
    guesser.start()
    try:
        wait_for(lambda: 429 in guessed, what="the guesser to be limited")
        # From the very address that is guessing: bob's known key and carol's key, never
        # seen here before, are answered every time.
        with _client(url, "127.0.0.2", bob) as b, _client(url, "127.0.0.2", carol) as k:
            codes = [(b.get("/v1/files").status_code, k.get("/v1/files").status_code)
                     for _ in range(20)]
    finally:
        stop.set()
        guesser.join(30)
    assert codes == [(200, 200)] * 20
    assert guessed[:3] == [401] * 3 and set(guessed[3:]) <= {401, 429}


def test_forwarded_for_only_from_trusted_proxies_and_ipv6_by_64(harness: Harness) -> None:
    _, url = _api_process(harness, unknown_key_rate_per_minute="3")
    # Not a trusted proxy: its X-Forwarded-For is ignored, so rotating it neither escapes
    # the limit nor aims it at another address.
    with _client(url, "127.0.0.2") as c:
        codes = [c.get("/v1/files", headers={**_random_key(),
                                             "X-Forwarded-For": f"127.0.0.{3 + i}"}).status_code
                 for i in range(5)]
    assert codes == [401, 401, 401, 429, 429]
    with _client(url, "127.0.0.3") as c:
        assert c.get("/v1/files", headers=_random_key()).status_code == 401

    # Behind a trusted proxy, X-Forwarded-For names the client; IPv6 clients by /64.
    _, url = _api_process(harness, unknown_key_rate_per_minute="3",
                          trusted_proxies="127.0.0.1")

    def as_client(address: str) -> int:
        return httpx.get(f"{url}/v1/files", headers={**_random_key(),
                                                     "X-Forwarded-For": address}).status_code

    assert [as_client(f"2001:db8::{i}") for i in range(1, 5)] == [401, 401, 401, 429]
    assert as_client("2001:db8:0:1::1") == 401
    assert as_client("203.0.113.7") == 401
