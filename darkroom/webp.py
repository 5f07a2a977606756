"""What the worker accepts from a decoder child as a derivative: checked, never decoded.

A compromised child can answer any bytes it likes. Before the worker stores them as
`image/webp`, the parent reads their container in pure Python (no decoder ever runs on
untrusted bytes outside the jail): a RIFF/WEBP file of exactly its declared length, one
still image (`VP8 `, `VP8L`, or `VP8X` with `ALPH`+`VP8 ` or `VP8L`, no metadata, no
animation), whose dimensions are the claimed ones and within the edge asked for, of a
size bounded by those pixels, and whose sha256 is the claimed one. The thumbhash must
decode to exactly the length its own header implies. Anything else is `InvalidDerivative`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

# Raw RGBA and the container's few headers: an encoder answering more has not encoded.
_BYTES_PER_PIXEL = 4
_OVERHEAD = 4096
# VP8X flags the derivatives never carry: ICC, EXIF, XMP, animation (encode(keep="none")).
_VP8X_FORBIDDEN = 0x20 | 0x08 | 0x04 | 0x02
_VP8X_ALPHA = 0x10
_THUMBHASH_MAX = 25


class InvalidDerivative(ValueError):
    """The child's answer is not a derivative this worker could have asked for."""


@dataclass(frozen=True)
class Checked:
    width: int
    height: int
    sha256: str


def _le(data: bytes) -> int:
    return int.from_bytes(data, "little")


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if len(data) < 20 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise InvalidDerivative("not a RIFF/WEBP file")
    if _le(data[4:8]) + 8 != len(data):
        raise InvalidDerivative("RIFF size is not the file's")
    chunks = []
    pos = 12
    while pos < len(data):
        if pos + 8 > len(data):
            raise InvalidDerivative("truncated chunk header")
        size = _le(data[pos + 4:pos + 8])
        end = pos + 8 + size
        if end > len(data):
            raise InvalidDerivative("chunk past the end")
        chunks.append((data[pos:pos + 4], data[pos + 8:end]))
        pos = end + (size & 1)
    if pos != len(data):
        raise InvalidDerivative("trailing bytes")
    return chunks


def _vp8(body: bytes) -> tuple[int, int]:
    if len(body) < 10 or body[0] & 1 or body[3:6] != b"\x9d\x01\x2a":
        raise InvalidDerivative("not a VP8 key frame")
    width, height = _le(body[6:8]), _le(body[8:10])
    if width >> 14 or height >> 14:
        raise InvalidDerivative("VP8 upscaling bits set")
    return width, height


def _vp8l(body: bytes) -> tuple[int, int]:
    if len(body) < 5 or body[0] != 0x2F:
        raise InvalidDerivative("not a VP8L bitstream")
    bits = _le(body[1:5])
    if bits >> 29:
        raise InvalidDerivative("unknown VP8L version")
    return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1


def webp_dimensions(data: bytes) -> tuple[int, int]:
    """Width and height of a still, metadata-free WebP, read from its headers alone."""
    chunks = _chunks(data)
    kinds = [kind for kind, _ in chunks]
    if kinds == [b"VP8 "]:
        return _vp8(chunks[0][1])
    if kinds == [b"VP8L"]:
        return _vp8l(chunks[0][1])
    if kinds[:1] != [b"VP8X"] or kinds[1:] not in ([b"ALPH", b"VP8 "], [b"VP8L"], [b"VP8 "]):
        raise InvalidDerivative(f"unexpected chunks {kinds!r}"[:120])
    header = chunks[0][1]
    if len(header) != 10 or header[0] & _VP8X_FORBIDDEN or header[1:4] != b"\0\0\0":
        raise InvalidDerivative("VP8X header")
    if bool(header[0] & _VP8X_ALPHA) != (kinds[1] == b"ALPH"):
        raise InvalidDerivative("VP8X alpha flag")
    canvas = (_le(header[4:7]) + 1, _le(header[7:10]) + 1)
    image = _vp8(chunks[-1][1]) if kinds[-1] == b"VP8 " else _vp8l(chunks[-1][1])
    if image != canvas:
        raise InvalidDerivative("image is not the canvas")
    return canvas


def max_payload(edge: int) -> int:
    """The most bytes a derivative within `edge` × `edge` may have."""
    return _BYTES_PER_PIXEL * edge * edge + _OVERHEAD


def check_derivative(data: bytes, meta: dict[str, Any], max_edge: int) -> Checked:
    """`data` as the WebP that `meta` (`width`, `height`, `sha256`) claims, or raise."""
    width, height, digest = meta["width"], meta["height"], meta["sha256"]
    if type(width) is not int or type(height) is not int or not isinstance(digest, str):
        raise InvalidDerivative("meta types")
    if not (0 < width <= max_edge and 0 < height <= max_edge):
        raise InvalidDerivative(f"claimed {width}x{height} outside the edge {max_edge}")
    if len(data) > _BYTES_PER_PIXEL * width * height + _OVERHEAD:  # max_payload's bound
        raise InvalidDerivative("larger than its pixels")
    if webp_dimensions(data) != (width, height):
        raise InvalidDerivative("dimensions are not the claimed ones")
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise InvalidDerivative("sha256 mismatch")
    return Checked(width, height, actual)


def _ac_count(nx: int, ny: int) -> int:
    """ThumbHash's AC coefficients of an nx×ny channel (its DC term not counted)."""
    return sum(1 for cy in range(ny) for cx in range(nx) if cx * ny < nx * (ny - cy)) - 1


def thumbhash_length(head: bytes) -> int:
    """The length, in bytes, of the ThumbHash that starts with these five bytes."""
    has_alpha = head[2] >> 7
    header16 = head[3] | head[4] << 8
    landscape = header16 >> 15
    limit = 5 if has_alpha else 7
    stored = header16 & 7
    lx, ly = (limit, max(3, stored)) if landscape else (max(3, stored), limit)
    if stored == 0:
        raise InvalidDerivative("thumbhash header")
    nibbles = _ac_count(lx, ly) + 2 * _ac_count(3, 3) + (_ac_count(5, 5) if has_alpha else 0)
    return (6 if has_alpha else 5) + (nibbles + 1) // 2


def check_thumbhash(value: Any) -> str:
    """A standard-base64 ThumbHash whose length is the one its header implies, or raise."""
    if not isinstance(value, str) or len(value) > 4 * ((_THUMBHASH_MAX + 2) // 3):
        raise InvalidDerivative("thumbhash type or length")
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InvalidDerivative("thumbhash is not base64") from None
    if len(raw) < 5 or len(raw) != thumbhash_length(raw) or len(raw) > _THUMBHASH_MAX:
        raise InvalidDerivative("thumbhash length")
    return value
