"""The wire protocol between the worker and its decoder child, one job at a time.

Over the child's stdin and stdout, after the child's hello (`HELLO`: its pid as the host
sees it, which is not the pid the worker started when the child has a PID namespace):

    request:  !II (json length, image length) + JSON limits + image bytes
    response: !II (json length, payload length) + JSON meta + payload

The response meta is `{"width", "height", "sha256", "thumb", "thumbhash"}` or
`{"error_code", "detail"}`; `thumb` is `{"width", "height", "sha256", "bytes"}`, and the
payload is the preview's WebP followed by the thumb's (its last `thumb.bytes` bytes).

Both sides bound what they accept, so a confused or hostile peer cannot make the other
allocate wildly; what the parent then accepts as a derivative is `darkroom.webp`'s call.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any, BinaryIO

FRAME = struct.Struct("!II")
HELLO = struct.Struct("!I")
MAX_META = 64 * 1024
# A response's payload, at most: a preview and a thumb. The parent asks for less, the
# bound `darkroom.webp` puts on images of the configured edges.
MAX_OUTPUT = 256 * 1024 * 1024


class ProtocolError(Exception):
    """The pipe broke, closed mid-frame, or carried something that is not a frame."""


def read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise ProtocolError(f"short read: {len(data)} of {size}")
    return data


def write_frame(out: BinaryIO, meta: dict[str, Any], payload: bytes = b"") -> None:
    encoded = json.dumps(meta).encode()
    out.write(FRAME.pack(len(encoded), len(payload)))
    out.write(encoded)
    out.write(payload)
    out.flush()


def read_frame(stream: IO[bytes], max_payload: int) -> tuple[dict[str, Any], bytes]:
    """One frame: a JSON object and its payload, each within bounds, or `ProtocolError`."""
    meta_len, payload_len = FRAME.unpack(read_exact(stream, FRAME.size))
    if meta_len > MAX_META or payload_len > max_payload:
        raise ProtocolError(f"bad frame {meta_len}/{payload_len}")
    try:
        meta = json.loads(read_exact(stream, meta_len))
    except (ValueError, RecursionError):  # nesting deeper than the parser's stack
        raise ProtocolError("meta is not JSON") from None
    if not isinstance(meta, dict):
        raise ProtocolError("meta is not an object")
    return meta, read_exact(stream, payload_len)
