"""How the API meets the network: uvicorn's settings and the limits of the HTTP layer.

Everything here runs before the application sees a request, so it costs an attacker's
request no database lookup and no parsing:
- a request's head (request line and headers) must arrive whole within the read timeout
  and be at most `MAX_HEADER_BYTES` (431 past it); a body may pause no longer than the
  read timeout between two pieces (a slow client is cut off, as nginx's
  `client_header_timeout` and `client_body_timeout` do), and must arrive, all told, at
  `min_body_bytes_per_second` at least once the read timeout has passed: trickling a few
  bytes just often enough holds a connection no longer than an honest slow upload;
- each process holds at most `max_connections` request connections; past it, a request
  takes the place of the connection idle the longest (one with no request under way:
  never used, between keep-alive requests, or still trickling its head), which is
  closed, so idle connections, however many addresses hold them, never deny a request;
  only when every connection is at work is the request answered 503 (uvicorn's
  `limit_concurrency`, counted here). Event streams
  (`GET /v1/events`) live long and are counted apart, in a pool of the same size, so
  open pages never take the place of anyone's requests;
- one client address (an IPv6 /64) holds at most `max_connections_per_client`
  connections; past it a new one is answered 503 and closed at once, before it is
  counted or timed. A trusted proxy's connections are not capped (its clients are many);
- at most `MAX_PIPELINED` requests wait behind the one being answered on a connection;
  past that the queued ones are answered, the rest is dropped unread and the connection
  closed, so pipelined requests cannot pile up in memory;
- an answer given before a request's body has arrived (413, 401, ...) reads a small body
  to its end as usual; after one given before a larger body (or one of unknown length),
  the connection ends: the answer says `connection: close`, is followed by a half-close,
  and the rest of the body is drained unparsed for at most `LINGER_SECONDS` and
  `LINGER_BYTES` (a "lingering close"), so the client reads the answer rather than a
  reset, and cannot make the server read on for long;
- the answers this layer writes itself carry the same security headers as the app's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import urllib.parse
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from darkroom.api.limits import client_bucket
from darkroom.api.problems import PROBLEM_MEDIA_TYPE, problem_body

# The request line plus every header, in bytes. Browsers send a few KiB at most; large
# cookies are the usual reason for more, and this API sets none.
MAX_HEADER_BYTES = 16 * 1024
# An answer that comes before a body of at most this size has arrived reads the rest of
# it as usual (the connection stays usable); a larger one is drained unparsed.
SMALL_BODY_BYTES = 64 * 1024
# After an answer, an idle keep-alive connection is closed this soon.
KEEP_ALIVE_SECONDS = 5
# After an answer that came before a larger body (or one of unknown length) had arrived,
# the rest of the body is drained for at most this long, and at most this much of it
# (then the connection is closed, reset if the client still sends). Closing a socket with
# unread bytes makes the kernel reset the connection, which can destroy the answer on its
# way (a lost segment is never sent again); draining gives it time to be acknowledged,
# a retransmission included (Linux's first retransmission timeout is 1 s), while a client
# still sending its body gets to reading the answer. The time bounds how long a client
# holds a connection that way (it does not count as idle: see _close_idlest), the bytes
# how much reading it costs: 8 MiB is what a client at 1 Gbit/s sends in about 70 ms.
LINGER_SECONDS = 2.0
LINGER_BYTES = 8 * 1024 * 1024
# Requests that may wait, parsed, behind the one being answered on one connection.
# Browsers do not pipeline at all; a client that does gains nothing past a few.
MAX_PIPELINED = 8
# Long-lived answers, counted apart from requests (see the module's docstring).
STREAM_PATHS = frozenset({b"/v1/events"})

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
_CLIENT_FULL = "This client address holds too many connections; close some and try again."


class _Refused(Exception):
    """Stops the parser: the request is answered by the protocol itself."""


@dataclass(frozen=True)
class Wire:
    """The limits of one API process's HTTP layer."""

    read_timeout: float
    max_header_bytes: int = MAX_HEADER_BYTES
    headers: tuple[tuple[str, str], ...] = ()
    max_connections: int = 1_000
    max_connections_per_client: int = 64
    min_body_bytes_per_second: int = 16 * 1024
    trusted_proxies: tuple[str, ...] = ()

    @cached_property
    def _trusted(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(net, strict=False) for net in self.trusted_proxies)

    def trusts(self, host: str) -> bool:
        """Whether a connection from `host` comes from a trusted proxy."""
        if not self.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self._trusted)


class _Counts:
    """What the connections of one server count together."""

    def __init__(self) -> None:
        self.per_client: Counter[str] = Counter()
        self.streams: set[GuardedProtocol] = set()


def _counts(server_state: Any) -> _Counts:
    counts: _Counts | None = getattr(server_state, "darkroom_counts", None)
    if counts is None:
        counts = _Counts()
        server_state.darkroom_counts = counts
    return counts


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
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingered = 0
        self._declared_length: int | None = None
        self._chunked = False
        self._counts = _counts(self.server_state)
        self._client_name: str | None = None
        self._streaming = False
        self._overflow = False
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_start = 0.0
        self._body_received = 0
        # Since when no request is under way on this connection (None: one is).
        self._idle_since: float | None = None

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

    def _arm_body(self) -> None:
        """Wakes when the body falls behind its minimum rate, if nothing more comes."""
        rate = self.wire.min_body_bytes_per_second
        due = self._body_start + self.wire.read_timeout + (self._body_received + 1) / rate
        self._body_timer = self.loop.call_at(due, self._body_check)

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_check(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        now = self.loop.time()
        rate = self.wire.min_body_bytes_per_second
        if self.flow.read_paused:
            # The application is behind, not the client: the time it takes is not held
            # against the client, who is deemed on time as of now.
            self._body_start = now - self.wire.read_timeout - self._body_received / rate
        elif self._body_received < (now - self._body_start - self.wire.read_timeout) * rate:
            # An answer may already be under way; all that is left is to hang up.
            self.transport.close()
            return
        self._arm_body()

    # --- connection and parser callbacks ----------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if host is not None and not self.wire.trusts(host):
            name = client_bucket(host)
            if self._counts.per_client[name] >= self.wire.max_connections_per_client:
                # Refused before it costs anything more: neither counted nor timed.
                self._answer(503, _CLIENT_FULL)
                return
            self._counts.per_client[name] += 1
            self._client_name = name
        self._idle_since = self.loop.time()
        self._arm()  # the first request's head must come in time, even its first byte

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self._client_name is not None:
            per_client = self._counts.per_client
            per_client[self._client_name] -= 1
            if per_client[self._client_name] <= 0:
                del per_client[self._client_name]
            self._client_name = None
        self._counts.streams.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES and not self.transport.is_closing():
                self.transport.close()
            return  # the rest of a body answered early: dropped unparsed
        if self._refusal is not None or self._overflow:
            return  # answered (or too far ahead): the rest is dropped unparsed
        if self._in_body and self._read_timer is not None:
            self._arm()  # the body moved: its pause starts again
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._in_body = False
        self._declared_length = None
        self._chunked = False
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
        if name.lower() == b"content-length" and value.strip().isdigit():
            self._declared_length = int(value)
        elif name.lower() == b"transfer-encoding":
            self._chunked = True
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if (self.cycle is not None and not self.cycle.response_complete
                and len(self.pipeline) >= MAX_PIPELINED):
            # Far ahead of its answers: the queued requests are answered, the last of
            # them with `connection: close`, and nothing more is read.
            self.pipeline[0][0].keep_alive = False
            self._overflow = True
            self.flow.pause_reading()
            raise _Refused
        streams = self._counts.streams
        limit = self.wire.max_connections
        stream = self.parser.get_method() == b"GET" and _path(self.url) in STREAM_PATHS
        if stream:
            full = len(streams) >= limit
        else:
            full = (len(self.connections) - len(streams) >= limit
                    or len(self.tasks) - len(streams) >= limit)
        if full and not stream and len(self.tasks) - len(streams) < limit:
            # Full of connections, not of work: the idlest makes room.
            full = not self._close_idlest()
        if full:
            # uvicorn's own check (limit_concurrency) would answer a bare text/plain 503
            # and count streams as requests; the same decision, answered like every
            # other error of this API.
            self._refusal = 503
            raise _Refused
        if stream:
            self._streaming = True
            streams.add(self)
        self._idle_since = None
        super().on_headers_complete()
        if ((self._chunked or (self._declared_length or 0) > SMALL_BODY_BYTES)
                and self.cycle is not None and self.cycle.scope is self.scope):
            self._end_early_answers(self.cycle)
        self._in_body = True
        self._arm()
        if self._chunked or (self._declared_length or 0) > 0:
            self._body_start = self.loop.time()
            self._body_received = 0
            self._arm_body()

    def on_body(self, body: bytes) -> None:
        self._body_received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        self._disarm_body()
        super().on_message_complete()

    def _end_early_answers(self, cycle: RequestResponseCycle) -> None:
        """An answer `cycle` begins before its request's body (larger than
        SMALL_BODY_BYTES) has arrived ends the connection, and says so.

        Without `connection: close` an HTTP/1.1 client takes the connection as reusable
        and may send its next request on it before the half-close reaches it: that
        request is drained with the rest of the body, and the client sees the connection
        end without an answer. uvicorn writes the header for a cycle that is not to be
        kept alive, and then closes the connection outright after the answer; with the
        body still arriving, the connection is instead closed lingering
        (on_response_complete).
        """
        send = cycle.send

        async def send_and_end(message: Any) -> None:
            if cycle.more_body:  # the request's body has not all arrived
                if message["type"] == "http.response.start":
                    cycle.keep_alive = False
                elif (message["type"] == "http.response.body"
                      and not message.get("more_body", False)):
                    cycle.keep_alive = True  # not closed outright: see above
            await send(message)

        # Read by uvicorn's run_asgi when the request's task starts, after this.
        cycle.send = send_and_end  # type: ignore[method-assign]

    def on_response_complete(self) -> None:
        # Early only if the request answered is the one whose body is arriving: with a
        # request queued behind it, the parser is in that later request's body, and the
        # one answered had all of its own read.
        answered_early = self._in_body and not self.pipeline
        if self._streaming:
            self._streaming = False
            self._counts.streams.discard(self)
        super().on_response_complete()
        self._disarm()  # idle now (uvicorn's keep-alive timer takes over), or lingering
        if not self.pipeline:
            self._idle_since = self.loop.time()
        small = (self._declared_length is not None
                 and self._declared_length <= SMALL_BODY_BYTES)
        if answered_early and small:
            # A small body still on its way (a client sends its head and its body in two
            # writes): read it to its end as usual, so the connection stays good for the
            # client's next request; the read timer still bounds the wait for it.
            return
        if answered_early and not self.transport.is_closing():
            # Answered before the request's body was read (413, 401, ...), with
            # `connection: close` (_end_early_answers). Closing now, with the client still
            # sending, would make the kernel reset the connection, and the client could
            # lose the answer; instead the answer is ended with a half-close and the rest
            # of the body is drained unparsed until the client hangs up, or for at most
            # LINGER_SECONDS and LINGER_BYTES (nginx's "lingering close"). Nothing of it
            # is kept.
            self._lingering = True
            self._disarm_body()  # the body is not read any more: the linger's bounds hold
            self._unset_keepalive_if_required()
            self._linger_timer = self.loop.call_later(LINGER_SECONDS, self._linger_over)
            if self.transport.can_write_eof():
                self.transport.write_eof()

    def _linger_over(self) -> None:
        self._linger_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _close_idlest(self) -> bool:
        """Close the connection idle the longest, if any: whether one was."""
        idlest: GuardedProtocol | None = None
        for other in self.connections:
            if (isinstance(other, GuardedProtocol) and other is not self
                    and other._idle_since is not None and not other._lingering
                    and not other.transport.is_closing()
                    and (idlest is None or other._idle_since < (idlest._idle_since or 0.0))):
                idlest = other
        if idlest is None:
            return False
        idlest._idle_since = None
        idlest.transport.close()
        return True

    # uvicorn answers 400 here for any parser error, ours included.
    def send_400_response(self, msg: str) -> None:
        if self._overflow:
            return  # the queued requests are still to be answered, in order
        self._answer(self._refusal or 400)

    def _answer(self, status: int, detail: str | None = None) -> None:
        self._refusal = status
        self._disarm()
        self._disarm_body()
        body = json.dumps(problem_body(status, _SLUGS[status],
                                       detail or _DETAILS[status])).encode()
        head = [f"HTTP/1.1 {status} {_REASONS[status]}",
                f"content-type: {PROBLEM_MEDIA_TYPE}",
                f"content-length: {len(body)}",
                "connection: close"]
        if status == 503:
            head.append("retry-after: 1")
        head += [f"{name}: {value}" for name, value in self.wire.headers]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()


def _path(url: bytes) -> bytes:
    """The path a request is routed by: as the application sees it, so that a stream
    asked for percent-encoded or in absolute form is counted as one."""
    return urllib.parse.unquote_to_bytes(httptools.parse_url(url).path)


def protocol_class(wire: Wire) -> type[GuardedProtocol]:
    return type("DarkroomHttpProtocol", (GuardedProtocol,), {"wire": wire})


def uvicorn_config(app: Any, *, wire: Wire, max_connections: int,
                   host: str = "127.0.0.1", port: int = 0) -> uvicorn.Config:
    """The uvicorn settings of every API process (and of the tests' servers)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(replace(wire, max_connections=max_connections)),
        log_config=None,
        access_log=False,
        # X-Forwarded-For names the client only when a trusted proxy sent it; from any
        # other peer it is the client's own word, and would aim per-address limits at
        # whoever it names.
        proxy_headers=bool(wire.trusted_proxies),
        forwarded_allow_ips=list(wire.trusted_proxies),
        # Counted by the protocol itself (streams apart): see GuardedProtocol.
        limit_concurrency=None,
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


