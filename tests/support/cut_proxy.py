"""A TCP proxy that loses answers: the request reaches the real server, which acts on it
and answers, and the client never hears (its connection is reset instead).

That is the unknown outcome a client meets on a real network (a load balancer reset, a
dropped link, a timeout just after the server committed), injected at the socket between
a real client and a real server, with nothing mocked on either side.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType


class CutProxy:
    """Forwards 127.0.0.1:<port> to an upstream; `cut_next(n)` loses the answers to the
    next n requests (on whichever connections they come), or only to requests that start
    with `request_prefix` (b"POST /v1/files ", say)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._to_cut = 0
        self._prefix: bytes | None = None
        self.cut = 0  # answers lost so far
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def cut_next(self, n: int = 1, request_prefix: bytes | None = None) -> None:
        with self._lock:
            self._to_cut += n
            self._prefix = request_prefix

    def _take_cut(self, request: bytes) -> bool:
        with self._lock:
            if self._to_cut > 0 and (self._prefix is None or request.startswith(self._prefix)):
                self._to_cut -= 1
                return True
            return False

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            armed = threading.Event()  # this connection's next answer is to be lost
            for args in ((client, server, armed, False), (server, client, armed, True)):
                t = threading.Thread(target=self._pipe, args=args, daemon=True)
                t.start()
                self._threads.append(t)

    def _pipe(self, src: socket.socket, dst: socket.socket, armed: threading.Event,
              answers: bool) -> None:
        """Copy src to dst. A request a cut is due for arms its connection; on the
        answering side, the answer's bytes prove the server acted: they are dropped and
        both sockets are reset."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not answers and not armed.is_set() and self._take_cut(data):
                    armed.set()
                if answers and armed.is_set():
                    with self._lock:
                        self.cut += 1
                    _reset(dst)
                    _reset(src)
                    return
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        # close() alone does not wake the accepter blocked in accept(); shutdown does.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            with contextlib.suppress(OSError):
                s.close()
        self._accepter.join(5)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> CutProxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _reset(sock: socket.socket) -> None:
    """Close with an RST, as a reset connection looks to its peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # A thread blocked in recv on this socket keeps it open past close(): wake it first
    # (SHUT_RD sends nothing), so the close happens now and sends the RST.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
