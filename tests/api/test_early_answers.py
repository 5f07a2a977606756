"""An answer given before the request's body has arrived (a 413 from the declared length,
or from a streamed upload counted past the limit), seen at the socket: it arrives whole,
it tells the client the connection ends, and the rest of the body is drained for a
bounded time and a bounded number of bytes, then the connection closed."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from darkroom.api.problems import PROBLEM_MEDIA_TYPE
from darkroom.api.server import LINGER_BYTES, LINGER_SECONDS
from tests.api.conftest import MAX_UPLOAD, Api
from tests.api.helpers import create

# How long the test waits on the server for anything, however slow the machine.
DEADLINE = 30.0
PIECE = 16 * 1024


def _head(path: str, framing: str, key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"PUT {path} HTTP/1.1\r\nHost: darkroom\r\nContent-Type: image/jpeg\r\n{auth}"
            f"{framing}\r\n").encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response (status, headers, body framed by its content-length): an
    AssertionError if the connection ends before it is complete."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before a whole response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    assert status_line.startswith("HTTP/1.1 "), status_line
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended {length - len(body)} bytes short of the body"
        body += chunk
    assert len(body) == length, "more than one response"
    return int(status_line.split()[1]), headers, body


def _port(api: Api) -> int:
    return int(api.url.rsplit(":", 1)[1])


def _rest(sock: socket.socket) -> bytes:
    """What the server sends after the response, until it ends the connection."""
    rest = b""
    try:
        while chunk := sock.recv(65536):
            rest += chunk
    except ConnectionResetError:
        pass  # ended after its FIN, with the client still sending: the answer was read
    return rest


def _assert_413(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 413, (status, body)
    assert headers["content-type"].startswith(PROBLEM_MEDIA_TYPE)
    problem = json.loads(body)
    assert problem["status"] == 413
    assert problem["type"].endswith("/payload_too_large")
    assert problem["limit"] == MAX_UPLOAD


class _Sender:
    """Sends `pieces` on `sock` from a thread of its own while the test reads, as a
    client that writes its body without waiting for an answer does; stops when the
    server hangs up."""

    def __init__(self, sock: socket.socket, pieces: list[bytes]) -> None:
        self.sock = sock
        self.pieces = pieces
        self.sent = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for piece in self.pieces:
                self.sock.sendall(piece)
                self.sent += len(piece)
        except OSError:
            pass  # the server hung up: what is left is not wanted
        finally:
            self.done.set()

    def join(self) -> None:
        assert self.done.wait(DEADLINE), "the sender was still blocked at the deadline"
        self.thread.join(DEADLINE)


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_an_early_413_arrives_whole_and_says_the_connection_ends(
        local_api: Api, framing: str) -> None:
    """The client keeps sending its body while it reads: the 413 arrives whole, says
    `connection: close`, and the server ends the connection after it, answering
    nothing else."""
    big = b"\xff" * (MAX_UPLOAD + 1)
    if framing == "declared":
        # Refused from its Content-Length, before any key is looked up.
        head = _head(f"/v1/files/{uuid.uuid4()}/content", f"Content-Length: {len(big)}\r\n")
        pieces = [big[i:i + PIECE] for i in range(0, len(big), PIECE)]
    else:
        # Counted as it comes by the upload route: a card to upload to, and a key.
        key = local_api.make_key()
        with local_api.client(key) as c:
            card = create(c, size=MAX_UPLOAD).json()
        head = _head(f"/v1/files/{card['id']}/content", "Transfer-Encoding: chunked\r\n", key)
        # Past the limit, and then more, never ending the body: the answer comes while
        # the body is still on its way.
        pieces = [b"%x\r\n" % PIECE + b"\xff" * PIECE + b"\r\n"
                  for _ in range(2 * MAX_UPLOAD // PIECE)]
    with socket.create_connection(("127.0.0.1", _port(local_api)), timeout=DEADLINE) as sock:
        sock.sendall(head)
        sender = _Sender(sock, pieces)
        status, headers, body = _read_response(sock)
        _assert_413(status, headers, body)
        # An HTTP/1.1 connection is persistent unless the answer says otherwise: without
        # `connection: close` a client may send its next request on this connection,
        # into the drain, and see the connection end without an answer to it.
        assert headers.get("connection") == "close", headers
        assert _rest(sock) == b""
        sender.join()


def test_a_client_goes_on_after_early_413s(local_api: Api) -> None:
    """The client of the contract tests (httpx: it writes the whole body, then reads)
    sends its next requests on the same client after each early 413: none is lost,
    whether the 413 came before the body had all arrived (the connection ends, and the
    client opens another) or after (the connection is kept)."""
    big = b"\xff" * (MAX_UPLOAD + 1)
    key = local_api.make_key()
    with local_api.client(key) as c:
        card = create(c, size=MAX_UPLOAD).json()
        content = f"/v1/files/{card['id']}/content"
        for _ in range(20):
            r = c.put(content, content=big)
            _assert_413(r.status_code, dict(r.headers), r.content)
            assert c.get(f"/v1/files/{card['id']}").status_code == 200
            r = c.put(content, content=iter([big]))  # chunked, counted past the limit
            assert r.status_code == 413, r.text
            assert c.get(f"/v1/files/{card['id']}").status_code == 200
    assert httpx.get(f"{local_api.url}/healthz").status_code == 200


def _receive_buffer_max() -> int:
    """The most the kernel lets a TCP socket's receive buffer grow to."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 32 * 1024 * 1024


def test_the_drain_is_bounded_in_bytes(local_api: Api) -> None:
    """A client that declares a huge body and sends it as fast as it can, reading nothing:
    the server drains at most LINGER_BYTES of it, then closes; the answer, already with
    the client, is still there to read after the reset."""
    head = _head(f"/v1/files/{uuid.uuid4()}/content", f"Content-Length: {10**12}\r\n")
    # What may sit in buffers between the two ends besides what the server drained.
    buffered = _receive_buffer_max() + 2 * 1024 * 1024
    piece = b"\xff" * (256 * 1024)
    with socket.create_connection(("127.0.0.1", _port(local_api)), timeout=DEADLINE) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
        sock.sendall(head)
        sent = 0
        ended = False
        while sent <= 4 * (LINGER_BYTES + buffered):  # well past the bound: it failed
            try:
                sent += sock.send(piece)
            except (BrokenPipeError, ConnectionResetError):
                ended = True
                break
        assert ended, f"the server still read after {sent} bytes"
        assert sent <= LINGER_BYTES + buffered
        status, headers, body = _read_response(sock)
        _assert_413(status, headers, body)
        assert headers.get("connection") == "close", headers


def test_the_drain_is_bounded_in_time(local_api: Api) -> None:
    """A client that goes on trickling its body after the answer: the server ends the
    connection LINGER_SECONDS after the answer, however the trickle goes on."""
    head = _head(f"/v1/files/{uuid.uuid4()}/content", f"Content-Length: {10**12}\r\n")
    with socket.create_connection(("127.0.0.1", _port(local_api)), timeout=DEADLINE) as sock:
        sock.sendall(head + b"\xff" * 1024)
        status, headers, body = _read_response(sock)
        answered = time.monotonic()
        _assert_413(status, headers, body)
        assert _rest(sock) == b""  # the half-close: the server drains on
        # A piece at a time, each after waiting up to 0.1 s for the reset that tells the
        # server has closed its end (a write to a closed socket is answered with one).
        poller = select.poll()
        poller.register(sock, select.POLLERR | select.POLLHUP)
        ended = False
        while not ended and time.monotonic() - answered < LINGER_SECONDS + DEADLINE:
            try:
                sock.send(b"\xff" * 1024)
            except (BrokenPipeError, ConnectionResetError):
                ended = True
            else:
                ended = bool(poller.poll(100))
        # Nothing else ends a lingering connection (the keep-alive timer is off): without
        # the bound it would still drain at the deadline. The allowance is for a loaded
        # machine's delays.
        assert ended, "the server still drained at the deadline"
        assert time.monotonic() - answered < LINGER_SECONDS + 10


def test_an_answer_to_a_request_pipelined_before_a_large_body_is_no_early_answer(
        local_api: Api) -> None:
    """Requests pipelined in one write, the last one's body too large and still on its
    way: each is answered in order, the earlier ones as usual; only the answer to the
    one whose body is still arriving ends the connection."""
    key = local_api.make_key()
    get = (f"GET /v1/files HTTP/1.1\r\nHost: darkroom\r\nAuthorization: Bearer {key}"
           "\r\n\r\n").encode()
    big = _head(f"/v1/files/{uuid.uuid4()}/content", f"Content-Length: {MAX_UPLOAD + 1}\r\n")
    with socket.create_connection(("127.0.0.1", _port(local_api)), timeout=DEADLINE) as sock:
        sock.sendall(get + get + big + b"\xff" * 10)
        answers = _rest(sock)
    heads = [part.split(b"\r\n\r\n", 1)[0].decode("latin-1")
             for part in answers.split(b"HTTP/1.1 ")[1:]]
    assert [head.split(" ", 1)[0] for head in heads] == ["200", "200", "413"], answers[:300]
    assert "connection: close" not in heads[0].lower()
    assert "connection: close" in heads[2].lower()
