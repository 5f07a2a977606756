"""A minimal keep-alive HTTP/1.1 client for the API benchmark's load generator.

The generator runs on the same two cores as the API it measures. httpx spent 0.8-1 core
on 200 requests/s here (as much as the API itself), so the generator's own CPU decided
the latency it reported. This client does only what the benchmark needs: a pool of
persistent connections, requests with an optional JSON body, and responses framed by
Content-Length (uvicorn frames every JSON answer that way). Like wrk, not a general client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 30.0
# What a request can fail with: a refused or dropped connection, a cut-off or malformed
# answer, or no answer in time.
ERRORS = (OSError, EOFError, asyncio.LimitOverrunError, TimeoutError, ValueError)


class Response:
    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # names lower-cased
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class LoadClient:
    """Up to `connections` concurrent requests, each on a kept-alive connection."""

    def __init__(self, base_url: str, headers: dict[str, str], connections: int) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ValueError(f"an http://host:port URL is needed, not {base_url!r}")
        self.host, self.port = url.hostname, url.port
        self._head = "".join(f"{k}: {v}\r\n" for k, v in
                             {"Host": f"{self.host}:{self.port}", **headers}.items())
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()

    async def get(self, path: str) -> Response:
        return await self.request("GET", path)

    async def post(self, path: str, json: Any = None) -> Response:
        return await self.request("POST", path, None if json is None else _dumps(json))

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        async with self._slots:
            reader, writer, reused = await self._connection()
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    try:
                        response = await self._exchange(reader, writer, method, path, body)
                    except asyncio.IncompleteReadError as exc:
                        # The server closed a kept-alive connection as we reused it (its
                        # idle timeout): nothing was answered, so send again on a new one.
                        if not reused or exc.partial:
                            raise
                        writer.close()
                        reader, writer = await asyncio.open_connection(self.host, self.port)
                        response = await self._exchange(reader, writer, method, path, body)
            except BaseException:
                writer.close()
                raise
            if response.headers.get("connection", "").lower() == "close":
                writer.close()
            else:
                self._idle.append((reader, writer))
            return response

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()  # closed by the server while idle
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return reader, writer, False

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        method: str, path: str, body: bytes | None) -> Response:
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise ValueError("the answer has no Content-Length")
        return Response(status, headers, await reader.readexactly(int(headers["content-length"])))


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
