"""Builders for benign and hostile test images, made in-process (no fixtures on disk)."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

from tests.support.services import CORPUS as CORPUS
from tests.support.services import corpus_photos

CORPUS_IMAGES = corpus_photos()

RED = (255, 0, 0)
GREEN = (0, 255, 0)
BLUE = (0, 0, 255)
WHITE = (255, 255, 255)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int, *, bit_depth: int = 8, colour: int = 0) -> bytes:
    """A PNG whose IHDR claims width × height, with a token IDAT: valid up to the header."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def png_zlib_bomb(width: int, height: int) -> bytes:
    """A real 1-bit greyscale PNG of zeros: complete and valid, tiny on disk, huge decoded."""
    row = b"\x00" * (1 + (width + 7) // 8)
    compressor = zlib.compressobj(9)
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", b"".join(parts))
        + png_chunk(b"IEND", b"")
    )


def flat(width: int, height: int, suffix: str, **options: object) -> bytes:
    """One colour, any size, encoded by libvips: its pixels are never all in memory, so
    a 50 MP header costs the test little. `suffix` picks the saver (".webp", ".png")."""
    import pyvips

    image = pyvips.Image.black(width, height).new_from_image([200, 30, 30])
    image = image.cast("uchar").copy(interpretation="srgb")
    data: bytes = image.write_to_buffer(suffix, **options)
    return data


def save(image: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def quadrants(width: int, height: int) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    image = Image.new("RGB", (width, height))
    half_w, half_h = width // 2, height // 2
    image.paste(RED, (0, 0, half_w, half_h))
    image.paste(GREEN, (half_w, 0, width, half_h))
    image.paste(BLUE, (0, half_h, half_w, height))
    image.paste(WHITE, (half_w, half_h, width, height))
    return image


def jpeg_with_orientation(upright: Image.Image, orientation: int) -> bytes:
    """Store `upright` so that applying EXIF `orientation` shows it upright again."""
    t = Image.Transpose
    # The inverse of the transform each orientation asks the viewer to apply.
    inverse = {
        1: None,
        2: t.FLIP_LEFT_RIGHT,
        3: t.ROTATE_180,
        4: t.FLIP_TOP_BOTTOM,
        5: t.TRANSPOSE,
        6: t.ROTATE_90,
        7: t.TRANSVERSE,
        8: t.ROTATE_270,
    }[orientation]
    stored = upright if inverse is None else upright.transpose(inverse)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return save(stored, "JPEG", quality=95, exif=exif.tobytes())


def heic(image: Image.Image, *, grid_tile: int | None = None, **options: object) -> bytes:
    """A HEIC made by pillow-heif's encoder (x265), not by the decoder under test."""
    import pillow_heif

    saved: int = pillow_heif.options.GRID_TILE_SIZE
    if grid_tile is not None:
        pillow_heif.options.GRID_TILE_SIZE = grid_tile
    try:
        buf = io.BytesIO()
        pillow_heif.from_pillow(image).save(buf, quality=90, **options)
        return buf.getvalue()
    finally:
        if grid_tile is not None:
            pillow_heif.options.GRID_TILE_SIZE = saved


def riff_chunks(webp: bytes) -> list[tuple[bytes, bytes]]:
    """The top-level chunks of a WebP file, parsed by hand."""
    assert webp[:4] == b"RIFF" and webp[8:12] == b"WEBP", "not a WebP"
    (riff_size,) = struct.unpack("<I", webp[4:8])
    assert riff_size + 8 == len(webp), "RIFF size mismatch"
    chunks = []
    pos = 12
    while pos < len(webp):
        kind = webp[pos : pos + 4]
        (size,) = struct.unpack("<I", webp[pos + 4 : pos + 8])
        chunks.append((kind, webp[pos + 8 : pos + 8 + size]))
        pos += 8 + size + (size & 1)
    assert pos == len(webp)
    return chunks


def decode_webp(webp: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(webp))
    assert image.format == "WEBP"
    image.load()
    return image


def close_to(pixel: object, want: tuple[int, int, int], tolerance: int = 40) -> bool:
    """A pixel as Pillow's getpixel answers it, within `tolerance` of `want` per channel."""
    assert isinstance(pixel, tuple), pixel
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], want, strict=True))
