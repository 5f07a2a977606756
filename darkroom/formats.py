"""The image formats darkroom takes, told by their magic numbers (never by name or label).

The one table both sides read: the deriver asks for the format (which loader may open the
bytes), the importer for the media type it declares on upload. Standard library only, so
`darkroom import` sniffs without mapping a decoder.
"""

from __future__ import annotations

# Format name -> media type, for every format the deriver decodes.
MEDIA_TYPES: dict[str, str] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "gif": "image/gif",
    "tiff": "image/tiff",
    "heic": "image/heic",
    "avif": "image/avif",
}

# Formats known by a fixed prefix.
_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    # Little- and big-endian TIFF, classic and BigTIFF.
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),
    (b"MM\x00+", "tiff"),
)

# ISOBMFF brands (the `ftyp` box) that name a HEVC-coded HEIF image or an AV1 one.
_HEIC_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
# A container that names only the generic mif1/msf1 brands is refused: which codec it
# needs is then unknown until the file is parsed.

# How much of a file's start `sniff` may need: the longest `ftyp` box it reads.
HEAD_BYTES = 4096


def _ftyp_brands(data: bytes) -> set[bytes]:
    """Major and compatible brands of an ISOBMFF `ftyp` box at the start, else empty."""
    if len(data) < 16 or data[4:8] != b"ftyp":
        return set()
    size = int.from_bytes(data[:4], "big")
    if size < 16 or size > min(len(data), HEAD_BYTES):
        return set()
    brands = {data[8:12]}
    brands.update(data[i : i + 4] for i in range(16, size - 3, 4))
    return brands


def sniff(data: bytes) -> str | None:
    """The format (a key of MEDIA_TYPES) these bytes claim by their magic number, else None."""
    for magic, kind in _PREFIXES:
        if data.startswith(magic):
            return kind
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    brands = _ftyp_brands(data)
    if brands & _HEIC_BRANDS:
        return "heic"
    if brands & _AVIF_BRANDS:
        return "avif"
    return None


def media_type(data: bytes) -> str | None:
    """The media type of the format these bytes claim, else None."""
    kind = sniff(data)
    return None if kind is None else MEDIA_TYPES[kind]
