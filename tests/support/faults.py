"""Network faults between real components, injected at the socket.

`FaultProxy` is a TCP proxy in a thread of the test process, between a darkroom process
and a real server (PostgreSQL, SeaweedFS), or between a client and darkroom's API. It
injects what a real network does and no
real component does on demand:

- `cut_before` / `cut_after` (PostgreSQL only: it reads the wire protocol): a connection
  is cut (a) with a statement the client sent, before it reaches the server, or (b) after
  the server answered a statement, with the answer dropped. With autocommit, (b) is the
  statement that committed while its sender sees an error.
- `cut_statement(fragment, where)` (PostgreSQL only): the same two cuts, once, at the next
  execution of a statement whose text holds `fragment` (a prepared statement is known by
  its name from its Parse on that connection): a test makes exactly that write's outcome
  unknown, and nothing else.
- `cut_answers(n)` (HTTP, or any protocol whose client speaks first): the next n requests
  reach the server, which acts on them and answers, and the client never hears: the
  answer is dropped and the connection reset (a load balancer reset, a dropped link just
  after the server committed). Counted as `cut_after`.
- `stall()`: connections stay open but nothing moves, new ones included; `stall_at(fragment)`
  (PostgreSQL only): the same, from the next execution of a statement whose text holds
  `fragment`, which is held: a server that froze with that statement on its way;
- `reset()`: every connection is reset (RST), new ones at once;
- `refuse()`: nothing listens (connection refused);
- `throttle()` (HTTP): every request is answered `503 SlowDown` with S3's XML error body,
  as a store that sheds load does, and never reaches the server; `throttle(match)` only
  the requests whose request line holds `match` (one object's key, say): a store that
  fails one file's requests and serves the rest; with `knock_over=s`, such a request
  also makes every request fail for s seconds: a request that knocks the store over;
- `heal()`: back to forwarding.

Counters say how many faults of each kind were injected, so a test can assert that its
faults happened at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.services import free_port

# Client messages that end a statement's round trip (extended protocol Sync, or a simple
# Query); server messages that a session sends unprompted (notifications, notices).
_STATEMENT_END = {ord("S"), ord("Q")}
_UNPROMPTED = {ord("A"), ord("N")}
_READY = ord("Z")
_METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")
_SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                   b"<Message>Please reduce your request rate.</Message>"
                   b"<RequestId>fault-proxy</RequestId></Error>")
SLOW_DOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
             b"Content-Length: " + str(len(_SLOW_DOWN_BODY)).encode() + b"\r\n"
             b"Connection: close\r\n\r\n" + _SLOW_DOWN_BODY)


@dataclass
class Counters:
    connections: int = 0
    cut_before: int = 0
    cut_after: int = 0
    reset: int = 0
    throttled: int = 0
    knocked_over: int = 0
    stalled: int = 0

    def __str__(self) -> str:
        return (f"connections={self.connections} cut_before={self.cut_before} "
                f"cut_after={self.cut_after} reset={self.reset} throttled={self.throttled} "
                f"knocked_over={self.knocked_over} stalled={self.stalled}")


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    answer_lost: bool = False  # the request in flight is one whose answer is to be lost
    # PostgreSQL: this connection's prepared statements (name: text), and the statement
    # the client's messages so far since its last Sync execute.
    statements: dict[bytes, bytes] = field(default_factory=dict)
    executing: bytes | None = None

    def abort(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None:
                _rst(writer)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a reset, as a dropped NAT entry or a killed peer does."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `upstream` ((host, port), or a Unix socket path)."""

    def __init__(self, upstream: tuple[str, int] | str, *, postgres: bool = False,
                 seed: int = 0) -> None:
        self.upstream = upstream
        self.postgres = postgres
        self.rng = random.Random(seed)
        self.cut_before_rate = 0.0
        self.cut_after_rate = 0.0
        self._answers_to_cut = 0
        self._statement_cut: tuple[bytes, str] | None = None
        self._cut_prefix: bytes | None = None
        self._throttle_match: bytes | None = None
        self._knock_over = 0.0
        self._knocked: asyncio.TimerHandle | None = None
        self.counters = Counters()
        self._mode = "forward"
        self._links: set[_Link] = set()
        self._healed = asyncio.Event()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self.port = free_port()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")
        self._thread.start()
        self._call(self._listen)

    # --- control, from the test's thread ------------------------------------------------

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def set_cuts(self, *, before: float = 0.0, after: float = 0.0) -> None:
        assert self.postgres, "statement cuts need the PostgreSQL wire protocol"

        def apply() -> None:
            self.cut_before_rate, self.cut_after_rate = before, after

        self._call(apply)

    def stall_at(self, fragment: bytes) -> None:
        """Stall (as `stall`) at the next execution of a statement whose text holds
        `fragment`, holding that statement: a server that froze with it on its way."""
        assert self.postgres, "statement stalls need the PostgreSQL wire protocol"

        def apply() -> None:
            self._statement_cut = (fragment, "stall")

        self._call(apply)

    def cut_statement(self, fragment: bytes, *, where: str) -> None:
        """Cut the connection once, at the next execution of a statement whose text holds
        `fragment`: `where` "before" it reaches the server, or "after" the server answered
        it (the answer dropped: with autocommit, the statement committed)."""
        assert self.postgres, "statement cuts need the PostgreSQL wire protocol"
        assert where in ("before", "after")

        def apply() -> None:
            self._statement_cut = (fragment, where)

        self._call(apply)

    @property
    def statement_cut_pending(self) -> bool:
        """Whether the cut set by `cut_statement` is still to happen."""
        return bool(self._call(lambda: self._statement_cut is not None))

    def cut_answers(self, n: int = 1, request_prefix: bytes | None = None) -> None:
        """Lose the answers to the next n requests, on whichever connections they come, or
        only to requests that start with `request_prefix` (b"POST /v1/files ", say)."""
        assert not self.postgres, "PostgreSQL statements are cut with set_cuts"

        def apply() -> None:
            self._answers_to_cut += n
            self._cut_prefix = request_prefix

        self._call(apply)

    def stall(self) -> None:
        self._call(lambda: self._set_mode("stall"))

    def throttle(self, match: bytes | None = None, *, knock_over: float = 0.0) -> None:
        """Answer requests 503 SlowDown: every one, or those whose request line holds
        `match` (forwarding the rest; with `knock_over`, failing all for that long)."""
        assert not self.postgres, "throttling answers HTTP requests"

        def apply() -> None:
            self._throttle_match = match
            self._knock_over = knock_over
            self._set_mode("forward" if match else "throttle")

        self._call(apply)

    def reset(self) -> None:
        def apply() -> None:
            self._set_mode("reset")
            for link in list(self._links):
                self.counters.reset += 1
                link.abort()

        self._call(apply)

    def refuse(self) -> None:
        async def apply() -> None:
            self._set_mode("refuse")
            if self._server is not None:
                self._server.close()
                self._server = None
            for link in list(self._links):
                link.abort()

        self._call(apply)

    def heal(self) -> None:
        async def apply() -> None:
            self._throttle_match = None
            if self._knocked is not None:
                self._knocked.cancel()
            self._set_mode("forward")
            if self._server is None:
                await self._listen()

        self._call(apply)

    def close(self) -> None:
        async def apply() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.abort()
            current = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not current]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(apply)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def url_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the proxy, on its own loop -----------------------------------------------------

    def _set_mode(self, mode: str) -> None:
        self._mode = mode
        if mode in ("forward", "throttle"):
            self._healed.set()
        else:
            self._healed.clear()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                                  reuse_address=True)
        if self._mode in ("forward", "throttle"):
            self._healed.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        self.counters.connections += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            if self._mode == "reset":
                self.counters.reset += 1
                return
            await self._healed.wait()  # a stalled proxy accepts and then says nothing
            if isinstance(self.upstream, str):
                up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            link.server = up_writer
            ready = asyncio.Event()
            pumps = [self._pump(reader, up_writer, link, from_client=True, ready=ready),
                     self._pump(up_reader, writer, link, from_client=False, ready=ready)]
            link.tasks = [asyncio.ensure_future(p) for p in pumps]
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for task in link.tasks:
                task.cancel()
            link.abort()
            self._links.discard(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link, *, from_client: bool, ready: asyncio.Event) -> None:
        frames = _Frames(startup=from_client) if self.postgres else None
        held = bytearray()  # messages not yet forwarded: one statement's worth
        while True:
            data = await reader.read(65536)
            if not data:
                return
            await self._healed.wait()
            if self._mode not in ("forward", "throttle"):
                return
            if frames is None:
                if from_client and self._throttled(data):
                    self.counters.throttled += 1
                    await self._slow_down(reader, link)
                    return
                if from_client and not link.answer_lost and self._take_answer_cut(data):
                    link.answer_lost = True
                elif not from_client and link.answer_lost:
                    # The answer's first bytes prove the server acted on the request.
                    self.counters.cut_after += 1
                    link.abort()
                    return
                writer.write(data)
                await writer.drain()
                continue
            for kind, message in frames.feed(data):
                if not ready.is_set():
                    writer.write(message)  # the connection's start-up passes untouched
                    if not from_client and kind == _READY:
                        ready.set()
                    continue
                if not from_client and kind in _UNPROMPTED and not held:
                    writer.write(message)
                    continue
                held += message
                if from_client:
                    self._note_statement(link, kind, message)
                if from_client and kind in _STATEMENT_END:
                    where = self._take_statement_cut(link)
                    if where == "stall":
                        # This statement is held, and from now on nothing moves.
                        self.counters.stalled += 1
                        self._set_mode("stall")
                        await self._healed.wait()
                        if self._mode not in ("forward", "throttle"):
                            return
                        where = None
                    if where == "before" or self.rng.random() < self.cut_before_rate:
                        self.counters.cut_before += 1
                        link.abort()
                        return
                    link.answer_lost = where == "after"
                    writer.write(held)
                    held.clear()
                elif not from_client and kind == _READY:
                    if link.answer_lost or self.rng.random() < self.cut_after_rate:
                        self.counters.cut_after += 1
                        link.abort()
                        return
                    writer.write(held)
                    held.clear()
            await writer.drain()


    @staticmethod
    def _note_statement(link: _Link, kind: int, message: bytes) -> None:
        """Follow which statement a round of the extended protocol executes."""
        body = message[5:]
        if kind == ord("P"):  # Parse: name, text
            name, text = body.split(b"\0", 2)[:2]
            link.statements[name] = text
        elif kind == ord("B"):  # Bind: portal, statement name
            name = body.split(b"\0", 2)[1]
            link.executing = link.statements.get(name)
        elif kind == ord("Q"):  # a simple query: its text
            link.executing = body.rstrip(b"\0")

    def _take_statement_cut(self, link: _Link) -> str | None:
        """At the end of a round: the cut to make, if this round executes the statement
        `cut_statement` names (consumed)."""
        executing, link.executing = link.executing, None
        if self._statement_cut is None or executing is None:
            return None
        fragment, where = self._statement_cut
        if fragment not in executing:
            return None
        self._statement_cut = None
        return where

    def _throttled(self, data: bytes) -> bool:
        if not data.startswith(_METHODS):
            return False  # not the start of a request: a body's later bytes
        if self._mode == "throttle":
            return True
        line = data.split(b"\r\n", 1)[0]
        if self._throttle_match is None or self._throttle_match not in line:
            return False
        if self._knock_over > 0:
            self.counters.knocked_over += 1
            self._set_mode("throttle")
            self._knocked = asyncio.get_running_loop().call_later(
                self._knock_over, self._stand_up)
        return True

    def _stand_up(self) -> None:
        if self._mode == "throttle":
            self._set_mode("forward")

    async def _slow_down(self, reader: asyncio.StreamReader, link: _Link) -> None:
        """Answer 503 SlowDown and close; the rest of the request (a body) is read and
        dropped until the client closes, so it hears the answer rather than a reset."""
        link.client.write(SLOW_DOWN)
        with contextlib.suppress(OSError):
            await link.client.drain()
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(5):
                while await reader.read(65536):
                    pass
        with contextlib.suppress(Exception):
            link.client.close()

    def _take_answer_cut(self, request: bytes) -> bool:
        if self._answers_to_cut > 0 and (
                self._cut_prefix is None or request.startswith(self._cut_prefix)):
            self._answers_to_cut -= 1
            return True
        return False


class _Frames:
    """Splits a PostgreSQL byte stream into messages: (type, whole message bytes)."""

    def __init__(self, *, startup: bool) -> None:
        self.buffer = bytearray()
        self.startup = startup  # the client's first message has no type byte

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buffer += data
        out: list[tuple[int, bytes]] = []
        while True:
            if self.startup:
                if len(self.buffer) < 4:
                    return out
                (length,) = struct.unpack("!I", self.buffer[:4])
                if len(self.buffer) < length:
                    return out
                out.append((0, bytes(self.buffer[:length])))
                del self.buffer[:length]
                self.startup = False
                continue
            if len(self.buffer) < 5:
                return out
            (length,) = struct.unpack("!I", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                return out
            out.append((self.buffer[0], bytes(self.buffer[:1 + length])))
            del self.buffer[:1 + length]


def through_proxy(db_url: str, seed: int = 0) -> tuple[FaultProxy, str]:
    """A PostgreSQL fault proxy in front of `db_url`'s server, and the URL through it."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(db_url)
    host = str(params.get("host") or "127.0.0.1")
    port = int(params.get("port") or 5432)
    upstream: tuple[str, int] | str = (
        f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port))
    proxy = FaultProxy(upstream, postgres=True, seed=seed)
    params.update(host="127.0.0.1", port=str(proxy.port), sslmode="disable",
                  gssencmode="disable")
    return proxy, make_conninfo("", **params)
