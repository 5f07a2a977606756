"""Facing the internet: limits before work, keys, bound uploads, headers,
metrics and local files, each against a real server (uvicorn over real sockets, the
real `darkroom api` process where the process itself is what is measured)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from darkroom.config import load_settings
from darkroom.layout import original_key
from darkroom.storage import LocalStore, open_store
from tests.api.conftest import _storage_url, start_api
from tests.api.helpers import JPEG, assert_problem, create, put_original, upload
from tests.support.services import DarkroomProcess, Harness, free_port, wait_for
from tests.support.sql import SQL


@pytest.fixture
def harness(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    storage_url = (tmp_path / "objects").as_uri()
    h = Harness(db_url, open_store(storage_url), storage_url, tmp_path)
    try:
        yield h
    finally:
        h.close()


def _api_process(harness: Harness, **env: str) -> tuple[DarkroomProcess, str]:
    port = free_port()
    proc = harness.start("api", "--port", str(port),
                         env={f"DARKROOM_{k.upper()}": v for k, v in env.items()})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.proc.poll() is None, proc.log()
        try:
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, what="the API to answer")
    return proc, url


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(60)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# --- 1. limits before work ------------------------------------------------------------


def test_limits_before_work(harness: Harness) -> None:
    proc, url = _api_process(harness, api_read_timeout_seconds="3", api_max_connections="4")
    port = int(url.rsplit(":", 1)[1])
    httpx.get(f"{url}/healthz")
    idle = _status(proc.pid, "VmRSS")
    # From here on VmHWM is the peak since this point (see proc(5), clear_refs).
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")

    # An unauthenticated 60 MB JSON body, declared: refused from its Content-Length, with
    # no key looked up and nothing parsed; and one streamed (chunked): refused once
    # counted past the cap. /healthz answers while the sender is still at it.
    for chunked in (False, True):
        sent = threading.Event()
        sock = socket.create_connection(("127.0.0.1", port))
        length = 60_000_000
        framing = (b"Transfer-Encoding: chunked\r\n" if chunked
                   else f"Content-Length: {length}\r\n".encode())
        sock.sendall(b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + framing + b"\r\n")

        def send_body(sock: socket.socket = sock, chunked: bool = chunked,
                      sent: threading.Event = sent, length: int = length) -> None:
            piece = b"[" + b"1," * 32_767 + b"1"
            try:
                for _ in range(length // len(piece)):
                    if chunked:
                        sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    else:
                        sock.sendall(piece)
            except OSError:
                pass  # the server hung up, as it should
            finally:
                sent.set()

        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        answer = _read_answer(sock)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        assert b"payload_too_large" in body
        assert httpx.get(f"{url}/healthz").status_code == 200
        sock.close()
        sender.join(60)
        assert sent.is_set()
    assert _status(proc.pid, "VmHWM") <= idle + 20 * 1024 * 1024

    # Oversized headers: 431, as a problem document.
    r = httpx.get(f"{url}/healthz", headers={"X-Big": "a" * 64 * 1024})
    assert_problem(r, 431, "headers_too_large")

    # The connection limit: 4 held idle connections deny no request; the idlest is closed
    # to make room (only connections at work fill the process: test_shares).
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    try:
        assert httpx.get(f"{url}/healthz").status_code == 200
        # Closed without a word to make room; or, on a slow machine where the request came
        # more than the read timeout after it, already answered 408 by that timeout.
        answer = _read_answer(held[0])
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
    finally:
        for s in held:
            s.close()
    assert httpx.get(f"{url}/healthz").status_code == 200

    # A slow client: half a request head, then nothing. The server answers 408 and
    # hangs up on its own (the wait is the socket's, not the test's measure).
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    answer = _read_answer(slow)
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    # And one that sent its head and a part of its body.
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    _read_answer(slow)  # returns only once the server has closed the connection
    slow.close()
    assert proc.proc.poll() is None


# --- 2. keys ----------------------------------------------------------------------------


def _cli(db_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
           "DARKROOM_DATABASE_URL": db_url, "DARKROOM_DATA_DIR": str(tmp_path / "cli")}
    return subprocess.run([sys.executable, "-m", "darkroom.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_unknown_keys_are_rate_limited_and_keys_can_be_revoked(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = start_api(db_url, _storage_url("local", tmp_path, request, monkeypatch),
                            tmp_path, "local", unknown_key_rate_per_minute=3,
                            key_cache_seconds=0, trusted_proxies="127.0.0.1")
    try:
        alice = api.make_key("alice")
        guesser = {"X-Forwarded-For": "203.0.113.7"}  # the proxy (loopback) is trusted
        with httpx.Client(base_url=api.url, headers=guesser) as c:
            for _ in range(3):
                r = c.get("/v1/files", headers={"Authorization": f"Bearer dk_{uuid.uuid4().hex}"})
                assert_problem(r, 401, "unauthorized")
            r = c.get("/v1/files", headers={"Authorization": f"Bearer dk_{uuid.uuid4().hex}"})
            assert_problem(r, 429, "too_many_requests")
            assert int(r.headers["retry-after"]) >= 1
            # Someone else's guesses never refuse a valid key: looked up one at a time.
            assert c.get("/v1/files", headers={"Authorization": f"Bearer {alice}"}
                         ).status_code == 200
        # Another address is not affected.
        with api.client(alice) as c:
            assert c.get("/v1/files", headers={"X-Forwarded-For": "198.51.100.1"}
                         ).status_code == 200

        # keys list shows a prefix of each key, never the key.
        bob1, bob2 = api.make_key("bob"), api.make_key("bob")
        listed = _cli(db_url, tmp_path, "keys", "list")
        assert listed.returncode == 0, listed.stderr
        assert alice[:12] in listed.stdout and bob1[:12] in listed.stdout
        assert alice not in listed.stdout and alice[:13] not in listed.stdout
        # revoke one key by its prefix; the API refuses it from then on.
        revoked = _cli(db_url, tmp_path, "keys", "revoke", alice[:12])
        assert revoked.returncode == 0, revoked.stderr
        with api.client(alice) as c:
            assert_problem(c.get("/v1/files"), 401, "unauthorized")
        # Again: nothing left to revoke, and it says so.
        assert _cli(db_url, tmp_path, "keys", "revoke", alice[:12]).returncode == 1
        # Too short a prefix is refused outright.
        assert _cli(db_url, tmp_path, "keys", "revoke", "dk_").returncode == 2
        # Every key of an owner.
        assert _cli(db_url, tmp_path, "keys", "revoke", "--owner", "bob").returncode == 0
        for key in (bob1, bob2):
            with api.client(key) as c:
                assert_problem(c.get("/v1/files"), 401, "unauthorized")
        listed = _cli(db_url, tmp_path, "keys", "list", "--all")
        assert listed.stdout.count("revoked") == 3
    finally:
        server.stop()


# --- 3. bound uploads -------------------------------------------------------------------


def test_presigned_upload_is_bound_to_the_declared_size(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = start_api(db_url, _storage_url("s3", tmp_path, request, monkeypatch),
                            tmp_path, "s3")
    try:
        with api.client(api.make_key()) as c:
            card = create(c, size=len(JPEG)).json()
            up = card["upload"]
            assert "content-length" in up["url"].lower()  # signed
            # A larger (or smaller) body is refused by the store itself.
            for body in (JPEG + b"\0" * 100_000, JPEG[:-1]):
                r = httpx.request(up["method"], up["url"], content=body, headers=up["headers"])
                assert r.status_code == 403, r.text
            key = original_key(uuid.UUID(card["id"]), "alice")
            assert list(api.store.list(key)) == []
            v1 = put_original(c, up, JPEG)
            v2 = put_original(c, up, JPEG[:-1] + b"\1")
            r = c.post(f"/v1/files/{card['id']}/confirm", json={"version": v2})
            assert r.status_code == 202, r.text
            # Only the confirmed version stays.
            wait_for(lambda: [v.version for v in api.store.list(key)] == [v2],
                     what="the unconfirmed upload to be deleted")
            assert v1 != v2
    finally:
        server.stop()


def test_uploads_quotas_and_creation_rate(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = start_api(db_url, _storage_url("local", tmp_path, request, monkeypatch),
                            tmp_path, "local", owner_quota_bytes=1_000, owner_quota_files=3)
    try:
        store = api.store
        with api.client(api.make_key("alice")) as c:
            # The API's own content route takes exactly the declared size.
            card = create(c, size=len(JPEG)).json()
            r = c.put(f"/v1/files/{card['id']}/content", content=JPEG + b"x",
                      headers={"Content-Type": "image/jpeg"})
            assert_problem(r, 422, "size_mismatch")
            key = original_key(uuid.UUID(card["id"]), "alice")
            assert list(store.list(key)) == []
            # A pending card keeps only its latest upload.
            v1 = put_original(c, card["upload"], JPEG)
            v2 = put_original(c, card["upload"], JPEG[:-1] + b"\1")
            assert [v.version for v in store.list(key)] == [v2] and v1 != v2
            # Bytes that reached the store another way, of another size: confirm refuses
            # them and deletes them.
            stray = store.put(key, JPEG + b"zz", content_type="image/jpeg")
            assert_problem(c.post(f"/v1/files/{card['id']}/confirm", json={"version": stray}),
                     422, "size_mismatch")
            assert [v.version for v in store.list(key)] == [v2]
            assert c.post(f"/v1/files/{card['id']}/confirm",
                          json={"version": v2}).status_code == 202

            # Quotas: 1,000 declared bytes per owner (this card holds len(JPEG) of them).
            assert create(c, size=500).status_code == 201
            body = assert_problem(create(c, size=500), 403, "quota_exceeded")
            assert "detail" in body
            # Three live cards: the third fits, a fourth does not.
            assert create(c, size=10).status_code == 201
            assert_problem(create(c, size=10), 403, "quota_exceeded")
            # A deleted card no longer counts.
            assert c.delete(f"/v1/files/{card['id']}").status_code == 202
            assert create(c, size=10).status_code == 201
        with api.client(api.make_key("bob")) as c:  # quotas are per owner
            assert create(c, size=900).status_code == 201
    finally:
        server.stop()


def test_creation_rate_limit_answers_429(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = start_api(db_url, _storage_url("local", tmp_path, request, monkeypatch),
                            tmp_path, "local", create_rate_per_minute=3)
    try:
        with api.client(api.make_key("alice")) as c:
            assert [create(c, size=1).status_code for _ in range(3)] == [201, 201, 201]
            r = create(c, size=1)
            assert_problem(r, 429, "too_many_requests")
            assert int(r.headers["retry-after"]) >= 1
        with api.client(api.make_key("alice")) as c:  # each key has its own allowance
            assert create(c, size=1).status_code == 201
    finally:
        server.stop()


def test_pending_cards_expire_with_their_bytes(harness: Harness, db_url: str,
                                               tmp_path: Path) -> None:
    _, url = _api_process(harness)
    key = _cli(db_url, tmp_path, "keys", "create", "--owner", "alice").stdout.strip()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        r = create(c, size=len(JPEG))
        assert r.status_code == 201, r.text
        old = r.json()  # created, and only a part of it ever stored
        harness.store.put(original_key(uuid.UUID(old["id"]), "alice"), JPEG[:100])
        stored, stored_version = upload(c)  # uploaded; its confirm never came (or was lost)
        late, late_version = upload(c)
        fresh, _ = upload(c)
    harness.db.execute(SQL["age_cards"], {"ids": [uuid.UUID(old["id"]), uuid.UUID(late["id"]),
                                                  uuid.UUID(stored["id"])]})
    # The late card is confirmed before the sweeper runs: it is not expired.
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        assert c.post(f"/v1/files/{late['id']}/confirm",
                      json={"version": late_version}).status_code == 202
    sweep = harness.start("sweep", "--once")
    assert sweep.wait(120) == 0, sweep.log()
    assert "pending confirmed (upload found): 1, pending expired: 1," in sweep.log()
    assert harness.db.execute(SQL["cards_with_id"],
                              {"id": uuid.UUID(old["id"])}).fetchone() == {"n": 0}
    assert list(harness.store.list(original_key(uuid.UUID(old["id"]), "alice"))) == []
    kinds = [e["kind"] for e in harness.events(uuid.UUID(old["id"]))]
    assert "expired" in kinds
    # The stored upload is the user's: its card is confirmed, never purged with it.
    assert [e["kind"] for e in harness.events(uuid.UUID(stored["id"]))] == ["upload_found"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        # A confirm after the expiry finds no card.
        r = c.post(f"/v1/files/{old['id']}/confirm", json={"version": "v"})
        assert_problem(r, 404, "not_found")
        assert c.get(f"/v1/files/{late['id']}").json()["status"] == "queued"
        assert c.get(f"/v1/files/{fresh['id']}").json()["status"] == "pending"
        found = c.get(f"/v1/files/{stored['id']}").json()
        assert found["status"] == "queued"
        # Its late confirm is answered as the repeat it now is.
        r = c.post(f"/v1/files/{stored['id']}/confirm", json={"version": stored_version})
        assert r.status_code == 202 and r.json()["status"] == "queued"


# --- 5. headers -------------------------------------------------------------------------


def _assert_security_headers(r: httpx.Response, store_origin: str | None = None) -> None:
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "img-src 'self' blob:" in csp
    if store_origin:
        assert store_origin in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert len(r.headers.get_list("content-security-policy")) == 1


def test_security_headers_and_upload_urls(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = start_api(db_url, _storage_url("local", tmp_path, request, monkeypatch),
                            tmp_path, "local")
    try:
        key = api.make_key()
        with api.client(key) as c:
            answers = [
                httpx.get(f"{api.url}/"),
                httpx.get(f"{api.url}/static/app.js"),
                httpx.get(f"{api.url}/healthz"),
                httpx.get(f"{api.url}/v1/files"),  # 401
                c.get(f"/v1/files/{uuid.uuid4()}"),  # 404
                c.post("/v1/files", content=b"x" * 100_000,
                       headers={"Content-Type": "application/json"}),  # 413, before auth
                httpx.get(f"{api.url}/healthz", headers={"X-Big": "a" * 64 * 1024}),  # 431
            ]
            assert [r.status_code for r in answers] == [200, 200, 200, 401, 404, 413, 431]
            for r in answers:
                _assert_security_headers(r)
            assert httpx.get(f"{api.url}/docs").status_code == 404
            # The upload URL is relative: a forged Host header is never reflected.
            r = c.post("/v1/files", json={"filename": "a.jpg", "content_type": "image/jpeg",
                                          "size": len(JPEG)},
                       headers={"Host": "evil.example"})
            assert r.status_code == 201, r.text
            assert r.json()["upload"]["url"] == f"/v1/files/{r.json()['id']}/content"
    finally:
        server.stop()
    # With DARKROOM_PUBLIC_URL, on that origin; and an S3 store's origin is in the CSP.
    server, api = start_api(db_url, _storage_url("s3", tmp_path, request, monkeypatch),
                            tmp_path / "s3", "s3", public_url="https://photos.example.net")
    try:
        with api.client(api.make_key()) as c:
            r = c.get("/v1/files", headers={"Host": "evil.example"})
            endpoint = os.environ["AWS_ENDPOINT_URL"].rstrip("/")
            _assert_security_headers(r, endpoint)
            r = c.get("/healthz")
            assert "evil.example" not in r.text
    finally:
        server.stop()
    settings = load_settings(public_url="https://photos.example.net/")
    assert settings.public_url == "https://photos.example.net"


# --- 6. metrics -------------------------------------------------------------------------


def test_metrics_are_not_public(harness: Harness, db_url: str, tmp_path: Path) -> None:
    metrics_port = free_port()
    _, url = _api_process(harness, api_metrics_port=str(metrics_port),
                          metrics_cache_seconds="3600")
    user = _cli(db_url, tmp_path, "keys", "create", "--owner", "alice").stdout.strip()
    ops = _cli(db_url, tmp_path, "keys", "create", "--owner", "ops", "--admin").stdout.strip()
    assert_problem(httpx.get(f"{url}/metrics"), 401, "unauthorized")
    assert_problem(httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {user}"}),
             403, "forbidden")
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    first = httpx.get(f"{metrics_url}/metrics")
    assert first.status_code == 200
    assert 'darkroom_queue_files{status="pending"} 0.0' in first.text
    # The metrics listener serves nothing else.
    assert_problem(httpx.get(f"{metrics_url}/v1/files"), 404, "not_found")
    assert_problem(httpx.get(f"{metrics_url}/"), 404, "not_found")
    # The gauges are read at most once per DARKROOM_METRICS_CACHE_SECONDS: a card made
    # after the first scrape is not counted by the next ones, however many.
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {user}"}) as c:
        assert create(c).status_code == 201
    for _ in range(5):
        again = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ops}"})
        assert again.status_code == 200
        assert 'darkroom_queue_files{status="pending"} 0.0' in again.text


# --- 7. local files ---------------------------------------------------------------------


def test_local_files_are_private(harness: Harness, db_url: str, tmp_path: Path) -> None:
    old = os.umask(0)  # whatever the umask, the modes hold from creation
    try:
        from darkroom.up import _local_key

        settings = load_settings(database_url=db_url, data_dir=str(tmp_path / "up-data"))
        from darkroom.storage.local import private_dir

        private_dir(settings.data_path)
        _local_key(settings, db_url)
        store = LocalStore(tmp_path / "data" / "objects")
        store.put("originals/x", b"bytes", content_type="image/jpeg")
    finally:
        os.umask(old)
    assert stat.S_IMODE(settings.data_path.stat().st_mode) == 0o700
    assert stat.S_IMODE((settings.data_path / "local-api-key").stat().st_mode) == 0o600
    for path in [store.root, *store.root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    # A put cut short by a crash leaves a temporary file; the sweeper removes it at start
    # once it is older than any put could be, and leaves a fresh one alone.
    stale = store.root / "originals" / "x" / ".tmp-0000000000000000-deadbeef"
    fresh = store.root / "originals" / "x" / ".tmp-0000000000000001-deadbeef"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1_000_000_000, 1_000_000_000))
    sweep = harness.start("sweep", "--once", env={
        "DARKROOM_STORAGE_URL": store.root.as_uri()})
    assert sweep.wait(120) == 0, sweep.log()
    assert not stale.exists() and fresh.exists()
    assert store.get("originals/x", next(iter(store.list("originals/x"))).version) == b"bytes"


def test_rate_limiter_refills_and_stays_bounded() -> None:
    from darkroom.api.limits import RateLimiter

    now = [0.0]
    limiter = RateLimiter(60, size=2, clock=lambda: now[0])  # one a second, bursts of 60
    assert [limiter.spend("a") for _ in range(60)] == [0] * 60
    assert limiter.spend("a") == 1 and limiter.retry_after("a") == 1
    now[0] += 2.0
    assert limiter.spend("a") == 0 and limiter.spend("a") == 0 and limiter.spend("a") == 1
    limiter.spend("b")
    limiter.spend("c")  # past `size` names: the least recently seen ("a") is forgotten
    assert limiter.spend("a") == 0
    assert RateLimiter(0).spend("x") == 0  # 0: no limit


def test_import_follows_relative_upload_urls(
        db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without DARKROOM_PUBLIC_URL the local store's upload URL is relative; `darkroom
    import` resolves it against the API's URL it was given."""
    from darkroom.importer import main as import_main
    from tests.api.helpers import image_bytes

    server, api = start_api(db_url, _storage_url("local", tmp_path, request, monkeypatch),
                            tmp_path, "local")
    try:
        key = api.make_key("importer")
        tree = tmp_path / "photos"
        tree.mkdir()
        (tree / "a.png").write_bytes(image_bytes("PNG"))
        settings = load_settings(api_url=api.url, api_key=key)
        assert import_main(settings, directory=str(tree), wait=False, concurrency=1) == 0
        with api.client(key) as c:
            assert [i["status"] for i in c.get("/v1/files").json()["items"]] == ["queued"]
    finally:
        server.stop()
