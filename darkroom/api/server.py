"""How the API meets the network: uvicorn's settings and the limits of the HTTP layer.

Everything here runs before the application sees a request, so it costs an attacker's
request no database lookup and no parsing:
- a request's head (request line and headers) must arrive whole within the read timeout
  and be at most `MAX_HEADER_BYTES` (431 past it); a body may pause no longer than the
  read timeout between two pieces (a slow client is cut off, as nginx's
  `client_header_timeout` and `client_body_timeout` do);
- each process holds at most `api_max_connections` connections; past it a request is
  answered 503 (uvicorn's `limit_concurrency`);
- the answers this layer writes itself carry the same security headers as the app's.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from darkroom.api.problems import PROBLEM_MEDIA_TYPE, problem_body

# The request line plus every header, in bytes. Browsers send a few KiB at most; large
# cookies are the usual reason for more, and this API sets none.
MAX_HEADER_BYTES = 16 * 1024
# After an answer, an idle keep-alive connection is closed this soon.
KEEP_ALIVE_SECONDS = 5

_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
_SLUGS = {400: "http_error", 408: "request_timeout", 431: "headers_too_large",
          503: "over_capacity"}
_DETAILS = {
    400: "The request is not valid HTTP.",
    408: "The request did not arrive in time.",
    431: f"The request's headers are larger than {MAX_HEADER_BYTES} bytes.",
    503: "The server is at its connection limit; try again later.",
}


class _Refused(Exception):
    """Stops the parser: the request is answered by the protocol itself."""


@dataclass(frozen=True)
class Wire:
    """The limits of one API process's HTTP layer."""

    read_timeout: float
    max_header_bytes: int = MAX_HEADER_BYTES
    headers: tuple[tuple[str, str], ...] = ()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header-size limit and read timeouts.

    uvicorn times out only idle keep-alive connections: a client that connects and then
    sends a request slowly, or stops half-way, holds a connection forever.
    """

    wire: Wire = Wire(read_timeout=15.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal: int | None = None
        self._head_bytes = 0
        self._read_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._lingering = False

    # --- timers ---------------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self.wire.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self._in_body:
            if self.flow.read_paused:
                # The application is behind, not the client: wait for it.
                self._arm()
                return
            # An answer may already be under way; all that is left is to hang up.
            self.transport.close()
            return
        self._answer(408)

    # --- connection and parser callbacks ----------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # the first request's head must come in time, even its first byte

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self._lingering:
            return  # answered: the rest of the request is dropped unparsed
        if self._in_body and self._read_timer is not None:
            self._arm()  # the body moved: its pause starts again
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._in_body = False
        if self._read_timer is None:  # a keep-alive connection's next request begins
            self._arm()
        super().on_message_begin()

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.wire.max_header_bytes:
            self._refusal = 431
            raise _Refused

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            # uvicorn's own check (limit_concurrency) would answer a bare text/plain 503;
            # the same decision, answered like every other error of this API.
            self._refusal = 503
            raise _Refused
        super().on_headers_complete()
        self._in_body = True
        self._arm()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        answered_early = self._in_body
        super().on_response_complete()
        self._disarm()  # idle now, or lingering: uvicorn's keep-alive timer takes over
        if answered_early and not self.transport.is_closing():
            # Answered before the request's body was read (413, 401, ...). Closing now,
            # with the client still sending, would make the kernel reset the connection,
            # and the client could lose the answer; instead the answer is ended with a
            # half-close and the rest of the body is drained unparsed until the client
            # hangs up or the keep-alive timer closes the connection (nginx's "lingering
            # close"). Nothing of it is kept.
            self._lingering = True
            if self.transport.can_write_eof():
                self.transport.write_eof()

    # uvicorn answers 400 here for any parser error, ours included.
    def send_400_response(self, msg: str) -> None:
        self._answer(self._refusal or 400)

    def _answer(self, status: int) -> None:
        self._refusal = status
        self._disarm()
        body = json.dumps(problem_body(status, _SLUGS[status], _DETAILS[status])).encode()
        head = [f"HTTP/1.1 {status} {_REASONS[status]}",
                f"content-type: {PROBLEM_MEDIA_TYPE}",
                f"content-length: {len(body)}",
                "connection: close"]
        if status == 503:
            head.append("retry-after: 1")
        head += [f"{name}: {value}" for name, value in self.wire.headers]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()


def protocol_class(wire: Wire) -> type[GuardedProtocol]:
    return type("DarkroomHttpProtocol", (GuardedProtocol,), {"wire": wire})


def uvicorn_config(app: Any, *, wire: Wire, max_connections: int,
                   host: str = "127.0.0.1", port: int = 0) -> uvicorn.Config:
    """The uvicorn settings of every API process (and of the tests' servers)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(wire),
        log_config=None,
        access_log=False,
        proxy_headers=True,
        limit_concurrency=max_connections,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=10,
        lifespan="on",
        # The security headers are the app's (they differ for /docs); uvicorn's own
        # `server` header names the software for nobody's benefit.
        server_header=False,
    )


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket, as uvicorn would make it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


