"""The S3 store against a real SeaweedFS, and against endpoints that misbehave on purpose."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from botocore.exceptions import ClientError

from darkroom.errors import (
    ObjectMissing,
    StorageConfigError,
    StorageError,
    StorageUnavailable,
)
from darkroom.storage import S3Store, make_client, open_store
from tests.storage.conftest import fresh_bucket_name
from tests.support.seaweed import SeaweedServer
from tests.support.services import free_port, wait_for


def assert_public(message: str) -> None:
    """A public message is one line, and carries no URL, address or boto text."""
    assert "\n" not in message
    for leak in ("http", "127.0.0.1", "localhost", "An error occurred", "botocore", "/tmp"):
        assert leak not in message


def quick_store(
    endpoint_url: str, seaweed: SeaweedServer, bucket: str = "some-bucket", timeout: float = 1.0
) -> S3Store:
    """A store that gives up fast: short timeouts, no retry."""
    client = make_client(
        endpoint_url=endpoint_url,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        connect_timeout=timeout,
        read_timeout=timeout,
        max_attempts=1,
    )
    return S3Store(bucket, "p", client=client)


def every_operation(store: S3Store) -> list[Callable[[], object]]:
    return [
        store.check,
        lambda: store.put("originals/a", b"x"),
        lambda: store.get("originals/a", "v1"),
        lambda: store.head("originals/a", "v1"),
        lambda: store.delete("originals/a", "v1"),
        lambda: store.delete("originals/a"),
        lambda: list(store.list("originals/")),
    ]


# -- start-up check --------------------------------------------------------------------


@pytest.mark.parametrize("state", ["never", "Suspended"])
def test_check_refuses_a_bucket_without_versioning_enabled(
    seaweed: SeaweedServer, s3_env: dict[str, str], state: str
) -> None:
    name = seaweed.create_bucket(fresh_bucket_name(), versioning=False)
    if state == "Suspended":
        client = seaweed.client()
        for status in ("Enabled", "Suspended"):
            client.put_bucket_versioning(
                Bucket=name,
                VersioningConfiguration={"Status": status},
            )
    store = S3Store(name, "x")
    with pytest.raises(StorageConfigError) as refused:
        store.check()
    message = str(refused.value)
    assert_public(message)
    shown = "Suspended" if state == "Suspended" else "not enabled"
    assert message == f"bucket '{name}' versioning is {shown}; darkroom needs Enabled"
    # Nor does a put on it hand out a version id that is not one.
    with pytest.raises(StorageConfigError) as refused:
        store.put("originals/a", b"x")
    assert_public(str(refused.value))


def test_check_refuses_a_missing_bucket(s3_env: dict[str, str]) -> None:
    name = fresh_bucket_name()
    with pytest.raises(StorageConfigError) as refused:
        S3Store(name, "").check()
    assert str(refused.value) == f"bucket '{name}' does not exist"


def test_check_refuses_wrong_credentials(seaweed: SeaweedServer, bucket: str) -> None:
    client = make_client(
        endpoint_url=seaweed.endpoint_url, access_key=seaweed.access_key, secret_key="wrong"
    )
    with pytest.raises(StorageConfigError) as refused:
        S3Store(bucket, "", client=client).check()
    assert_public(str(refused.value))
    assert "denied" in str(refused.value)


def test_open_store_from_the_environment(s3_env: dict[str, str], bucket: str) -> None:
    store = open_store(f"s3://{bucket}/deep/prefix/")
    assert isinstance(store, S3Store)
    store.check()
    version = store.put("originals/e", b"env")
    assert store.get("originals/e", version) == b"env"


# -- prefix and versions as S3 sees them --------------------------------------------------


def test_keys_live_under_the_prefix_and_stores_do_not_see_each_other(
    seaweed: SeaweedServer, s3_env: dict[str, str], bucket: str
) -> None:
    one, two = S3Store(bucket, "one"), S3Store(bucket, "/two/")
    v1 = one.put("originals/a", b"1")
    v2 = two.put("originals/a", b"2")
    raw = seaweed.client().list_object_versions(Bucket=bucket)
    assert {(v["Key"], v["VersionId"]) for v in raw["Versions"]} == {
        ("one/originals/a", v1),
        ("two/originals/a", v2),
    }
    assert [v.version for v in one.list("")] == [v1]
    assert [v.version for v in two.list("")] == [v2]
    with pytest.raises(ObjectMissing):
        one.get("originals/a", v2)


def test_deletes_leave_neither_versions_nor_delete_markers(
    seaweed: SeaweedServer, s3_env: dict[str, str], bucket: str
) -> None:
    store = S3Store(bucket, "")
    kept = store.put("originals/keep", b"k")
    first = store.put("originals/gone", b"1")
    store.put("originals/gone", b"2")
    raw = seaweed.client()
    # A marker someone else made: delete(key) must clear it too.
    raw.delete_object(Bucket=bucket, Key="originals/gone")
    store.delete("originals/gone", first)
    store.delete("originals/gone")
    listing = raw.list_object_versions(Bucket=bucket)
    assert [(v["Key"], v["VersionId"]) for v in listing.get("Versions", [])] == [
        ("originals/keep", kept)
    ]
    assert listing.get("DeleteMarkers", []) == []


def test_a_delete_marker_is_not_an_object(
    seaweed: SeaweedServer, s3_env: dict[str, str], bucket: str
) -> None:
    store = S3Store(bucket, "")
    version = store.put("originals/m", b"m")
    marker = seaweed.client().delete_object(Bucket=bucket, Key="originals/m")["VersionId"]
    assert store.get("originals/m", version) == b"m"  # exact versions outlive the marker
    with pytest.raises(ObjectMissing):
        store.head("originals/m", marker)
    with pytest.raises(ObjectMissing):
        store.get("originals/m", marker)
    assert [v.version for v in store.list("originals/")] == [version]


# -- outages -----------------------------------------------------------------------------


def test_a_refused_connection_is_unavailable(seaweed: SeaweedServer) -> None:
    store = quick_store(f"http://127.0.0.1:{free_port()}", seaweed)
    for operation in every_operation(store):
        with pytest.raises(StorageUnavailable) as failed:
            operation()
        assert_public(str(failed.value))


def test_a_frozen_server_is_unavailable_and_recovers(
    seaweed: SeaweedServer, s3_env: dict[str, str], bucket: str
) -> None:
    version = S3Store(bucket, "p").put("originals/f", b"frozen")
    stalled = quick_store(seaweed.endpoint_url, seaweed, bucket)
    assert stalled.get("originals/f", version) == b"frozen"
    with seaweed.frozen():
        # Each call ends with an error, not a hang: the client's timeouts bound it.
        for operation in (lambda: stalled.get("originals/f", version), stalled.check):
            with pytest.raises(StorageUnavailable) as failed:
                operation()
            assert_public(str(failed.value))
    # Back to normal once thawed: wait, with a deadline, until a request succeeds.

    def answers() -> bool:
        try:
            return stalled.get("originals/f", version) == b"frozen"
        except StorageUnavailable:
            return False

    wait_for(answers, timeout=30, what="the thawed store")


class _Answer(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 so that "Expect: 100-continue" is answered, as real S3 servers do.
    protocol_version = "HTTP/1.1"
    status = 503
    code = "SlowDown"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{self.code}</Code>"
            f"<Message>go away http://secret.example/</Message></Error>"
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def misbehaving_endpoint(status: int, code: str) -> Iterator[str]:
    """A real HTTP server on loopback that answers every request with one S3 error."""
    handler = type("Handler", (_Answer,), {"status": status, "code": code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "SlowDown"), (500, "InternalError"), (503, "ServiceUnavailable"), (502, "BadGateway")],
)
def test_server_errors_and_throttling_are_unavailable(
    seaweed: SeaweedServer, status: int, code: str
) -> None:
    with misbehaving_endpoint(status, code) as url:
        store = quick_store(url, seaweed)
        for operation in every_operation(store):
            with pytest.raises(StorageUnavailable) as failed:
                operation()
            assert_public(str(failed.value))


@pytest.fixture
def hanging_up_endpoint() -> Iterator[str]:
    """Accepts each connection and closes it at once, mid-request."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
        thread.join(5)


def test_a_connection_cut_mid_request_is_unavailable(
    seaweed: SeaweedServer, hanging_up_endpoint: str
) -> None:
    store = quick_store(hanging_up_endpoint, seaweed)
    for operation in every_operation(store):
        with pytest.raises(StorageUnavailable):
            operation()


def test_other_refusals_are_plain_storage_errors(seaweed: SeaweedServer) -> None:
    with misbehaving_endpoint(400, "MalformedXML") as url:
        store = quick_store(url, seaweed)
        with pytest.raises(StorageError) as failed:
            store.put("originals/a", b"x")
        assert type(failed.value) is StorageError
        assert_public(str(failed.value))


def test_digest_uses_the_checksum_the_store_verified(
    s3_env: dict[str, str], bucket: str
) -> None:
    """A version uploaded with x-amz-checksum-sha256 is answered from the store's own
    checksum (SeaweedFS verifies it at PUT: a body that does not match is refused)."""
    store = S3Store(bucket, "p")
    client = make_client()
    data = b"checked bytes" * 1000
    claimed = base64.b64encode(hashlib.sha256(data).digest()).decode()
    version = client.put_object(Bucket=bucket, Key="p/k", Body=data,
                                ChecksumSHA256=claimed)["VersionId"]
    assert store.digest("k", version) == hashlib.sha256(data).hexdigest()
    lying = base64.b64encode(hashlib.sha256(b"x").digest()).decode()
    with pytest.raises(ClientError):
        client.put_object(Bucket=bucket, Key="p/k", Body=data, ChecksumSHA256=lying)
