"""Free TCP ports for the servers a benchmark starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
