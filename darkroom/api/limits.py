"""The API's limits inside the application: body size before anything reads a body,
security headers on every answer, and the rate limits of unknown keys and of creations.

Both middlewares are pure ASGI and sit outside routing, so they run before any key is
looked up and before FastAPI parses a body.
"""

from __future__ import annotations

import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from darkroom.api.problems import PROBLEM_MEDIA_TYPE, problem_body

# Every JSON body of this API is a few hundred bytes (the longest is a card's creation,
# with a file name of at most a few hundred characters).
MAX_JSON_BYTES = 16 * 1024

DOCS_PATHS = ("/docs", "/docs/oauth2-redirect")
# What Swagger UI needs when /docs is enabled: its CDN and the inline script that starts it.
_DOCS_CDN = "https://cdn.jsdelivr.net"


def client_bucket(host: str) -> str:
    """The name a client address is counted by: an IPv6 address by its /64 (what one
    subscriber is usually given, so hopping within it gains nothing), an IPv4 one whole."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


def content_security_policy(store_origin: str | None) -> str:
    """The page's policy: its own scripts only; images and fetches also from the store
    (a derivative's presigned URL) and from blob: (how the page shows a fetched WebP)."""
    store = f" {store_origin}" if store_origin else ""
    return (f"default-src 'self'; img-src 'self' blob:{store}; connect-src 'self'{store}; "
            "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def security_headers(store_origin: str | None) -> tuple[tuple[str, str], ...]:
    return (
        ("content-security-policy", content_security_policy(store_origin)),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    )


def _docs_headers(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    policy = (f"default-src 'self'; script-src 'self' 'unsafe-inline' {_DOCS_CDN}; "
              f"style-src 'self' {_DOCS_CDN}; img-src 'self' data: https://fastapi.tiangolo.com; "
              "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
    return tuple((n, policy if n == "content-security-policy" else v) for n, v in headers)


def origin_of(url: str | None) -> str | None:
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


class SecurityHeaders:
    """Adds the security headers to every answer the application gives."""

    def __init__(self, app: ASGIApp, headers: tuple[tuple[str, str], ...]) -> None:
        self.app = app
        self.raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
        self.docs_raw = [(n.encode("latin-1"), v.encode("latin-1"))
                         for n, v in _docs_headers(headers)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self.docs_raw if scope["path"] in DOCS_PATHS else self.raw

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _is_upload(scope: Scope) -> bool:
    path: str = scope["path"]
    return scope["method"] == "PUT" and path.startswith("/v1/files/") and path.endswith("/content")


class BodyLimit:
    """Refuses a body over its limit before the application reads a byte of it.

    JSON bodies are capped at `MAX_JSON_BYTES`, uploads (`PUT …/content`) at the upload
    limit. A declared `Content-Length` over the limit is answered at once; a chunked body
    is counted as it comes (JSON bodies are small, so they are read whole here and
    handed on) and refused the moment it passes the limit. The rest of the body is
    drained unparsed, then the connection closed (`darkroom.api.server`).
    """

    def __init__(self, app: ASGIApp, *, upload_limit: int,
                 json_limit: int = MAX_JSON_BYTES) -> None:
        self.app = app
        self.upload_limit = upload_limit
        self.json_limit = json_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = _is_upload(scope)
        limit = self.upload_limit if upload else self.json_limit
        declared: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                chunked = True
        if declared is not None and declared > limit:
            await _too_large(send, limit, upload)
            return
        if upload or not chunked:
            # A declared length frames the body: it cannot be longer. An upload of unknown
            # length is counted by its route, which stores it as it comes.
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app will find out when it reads
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > limit:
                await _too_large(send, limit, upload)
                return
            parts.append(body)
            more = bool(message.get("more_body", False))
        whole: Message | None = {"type": "http.request", "body": b"".join(parts),
                                 "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Send, limit: int, upload: bool) -> None:
    detail = (f"The file is larger than the upload limit of {limit} bytes." if upload
              else f"The request body is larger than {limit} bytes.")
    body = json.dumps(problem_body(413, "payload_too_large", detail, limit=limit)).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
    ]})
    await send({"type": "http.response.body", "body": body})


class RateLimiter:
    """Token buckets by name: `rate` events per minute each, bursts up to `rate`.

    At most `size` names are tracked (the least recently seen go first, which only ever
    gives a name a full bucket again), so an attacker's many addresses cost bounded memory.
    """

    def __init__(self, rate_per_minute: float, *, size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = float(rate_per_minute)
        self.size = size
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _level(self, name: str) -> float:
        entry = self._buckets.get(name)
        if entry is None:
            return self.burst
        tokens, at = entry
        return min(self.burst, tokens + (self._clock() - at) * self.rate)

    def tokens(self, name: str) -> float:
        """What is left of `name`'s bucket now."""
        return self._level(name)

    def retry_after(self, name: str) -> int:
        """0 when `name` may go on now, else whole seconds until it may."""
        if self.burst <= 0:
            return 0
        level = self._level(name)
        return 0 if level >= 1.0 else max(1, math.ceil((1.0 - level) / self.rate))

    def spend(self, name: str) -> int:
        """Take one token for `name`: 0 if there was one, else the seconds to wait."""
        if self.burst <= 0:
            return 0
        wait = self.retry_after(name)
        if wait:
            return wait
        self._buckets[name] = (self._level(name) - 1.0, self._clock())
        self._buckets.move_to_end(name)
        while len(self._buckets) > self.size:
            self._buckets.popitem(last=False)
        return 0
