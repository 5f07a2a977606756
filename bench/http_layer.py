"""The HTTP layer's own CPU per request, free of the machine's noise: one tree's API
protocol (`darkroom.api.server`, with its limits) fed kept-alive GETs through an
in-memory transport, with a do-nothing application. Run by `bench.api_limits` in a child
interpreter per tree (`python -P -m bench.http_layer`, PYTHONPATH = the tree), so both
trees' code is measured in one run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

REQUEST = (b"GET /v1/files/0b0f6b5e-0000-4000-8000-000000000000 HTTP/1.1\r\nHost: x\r\n"
           b"Authorization: Bearer dk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"
           b"Accept: */*\r\nUser-Agent: bench\r\n\r\n")


class _Socket:
    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 40000)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 8000)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return _Socket() if name == "socket" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def measure(requests: int) -> float:
    """CPU µs per request of the protocol with this tree's limits."""
    from uvicorn.server import ServerState

    from darkroom.api.server import Wire, uvicorn_config

    config = uvicorn_config(_app, wire=Wire(read_timeout=15.0), max_connections=1000)
    config.load()
    loop = asyncio.get_running_loop()
    cls: Any = config.http_protocol_class
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = _Transport()
    protocol.connection_made(transport)
    for _ in range(200):  # warm-up
        protocol.data_received(REQUEST)
        while protocol.tasks:
            await asyncio.sleep(0)
    start = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while protocol.tasks:
            await asyncio.sleep(0)
    used = time.process_time() - start
    assert not transport.closed and transport.written > 0
    return used / requests * 1e6


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000))))
