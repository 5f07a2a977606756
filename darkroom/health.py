"""A worker's own listener: `/metrics` for Prometheus and `/healthz` for a liveness probe.

`/healthz` answers 200 only while the worker's event loop is turning: a task on the loop
stamps the time every second, and the listener (a thread of its own) answers 503 once
the stamp is older than `STALE_SECONDS`. A process that is alive but stuck (a blocking
call on the loop, a deadlock) fails the probe, which a bare metrics endpoint would not.
"""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from darkroom import metrics  # noqa: F401 - registers the worker's instruments

TICK_SECONDS = 1.0
STALE_SECONDS = 15.0


class LoopPulse:
    """The last time the event loop ran a tick (monotonic clock)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    async def run(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def alive(self) -> bool:
        return time.monotonic() - self.last < STALE_SECONDS


def serve(host: str, port: int, pulse: LoopPulse) -> ThreadingHTTPServer:
    """Start the listener in a daemon thread; answers the server (for `shutdown`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = pulse.alive()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"event loop stalled\n",
                             "text/plain; charset=utf-8")
            else:
                self._answer(404, b"not found\n", "text/plain; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the worker's own log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="health").start()
    return server
