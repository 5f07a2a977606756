"""HEIC/HEIF, AVIF and TIFF, and the two derivatives every format yields.

Every file here is made by a different library than the one that decodes it:

* HEIC by pillow-heif's encoder (x265); darkroom decodes it with libde265 (pillow-heif);
* AVIF by Pillow's own AVIF plugin (libavif); darkroom decodes it with libvips (libheif);
* TIFF by Pillow (its own TIFF writer); darkroom decodes it with libvips (libtiff).
"""

from __future__ import annotations

import base64
import io
from dataclasses import replace

import pytest
from fast_thumbhash import thumb_hash_to_average_rgba
from PIL import Image

from darkroom.config import load_settings
from darkroom.derive import Derivative, Limits, derive
from darkroom.errors import DeriveError, ErrorCode
from darkroom.formats import sniff
from tests.derive import images as im

LIMITS = Limits.from_settings(load_settings())
FORMATS = ("heic", "avif", "tiff")


def make(kind: str, image: Image.Image, **options: object) -> bytes:
    if kind == "heic":
        return im.heic(image, **options)  # type: ignore[arg-type]
    if kind == "avif":
        return im.save(image, "AVIF", quality=90, **options)
    return im.save(image, "TIFF", compression="tiff_lzw", **options)


def code_of(data: bytes, limits: Limits = LIMITS) -> ErrorCode:
    with pytest.raises(DeriveError) as info:
        derive(data, limits)
    return info.value.code


def upright_quadrants(result: Derivative, size: tuple[int, int]) -> None:
    out = im.decode_webp(result.data).convert("RGB")
    assert out.size == size
    w, h = size
    assert im.close_to(out.getpixel((w // 4, h // 4)), im.RED)
    assert im.close_to(out.getpixel((3 * w // 4, h // 4)), im.GREEN)
    assert im.close_to(out.getpixel((w // 4, 3 * h // 4)), im.BLUE)
    assert im.close_to(out.getpixel((3 * w // 4, 3 * h // 4)), im.WHITE)


@pytest.mark.parametrize("kind", FORMATS)
def test_decodes_to_the_same_picture(kind: str) -> None:
    data = make(kind, im.quadrants(96, 64))
    assert sniff(data) == kind
    upright_quadrants(derive(data, LIMITS), (96, 64))


@pytest.mark.parametrize("kind", FORMATS)
def test_large_image_downscaled_with_thumb(kind: str) -> None:
    result = derive(make(kind, im.quadrants(3000, 2000)), LIMITS)
    upright_quadrants(result, (2048, 1365))
    assert result.thumb is not None
    upright_quadrants(result.thumb, (400, 267))


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_orientation_honoured(kind: str, orientation: int) -> None:
    upright = im.quadrants(96, 64)
    t = Image.Transpose
    stored = upright.transpose({3: t.ROTATE_180, 6: t.ROTATE_90, 8: t.ROTATE_270}[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = make(kind, stored, exif=exif.tobytes())
    upright_quadrants(derive(data, LIMITS), (96, 64))


@pytest.mark.parametrize("kind", FORMATS)
def test_truncated_is_invalid(kind: str) -> None:
    data = make(kind, im.quadrants(300, 200))
    for cut in (len(data) // 2, len(data) - 16, 64):
        assert code_of(data[:cut]) == ErrorCode.INVALID_IMAGE, cut


@pytest.mark.parametrize("kind", FORMATS)
def test_malformed_is_invalid(kind: str) -> None:
    data = bytearray(make(kind, im.quadrants(300, 200)))
    # Keep the magic bytes, scramble the structure after them.
    for i in range(32, len(data), 7):
        data[i] ^= 0x5A
    assert code_of(bytes(data)) == ErrorCode.INVALID_IMAGE


@pytest.mark.parametrize("kind", FORMATS)
def test_pixel_limit_from_the_header(kind: str) -> None:
    data = make(kind, im.quadrants(640, 480))
    assert code_of(data, replace(LIMITS, max_pixels=640 * 480 - 1)) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(data, replace(LIMITS, max_dimension=639)) == ErrorCode.IMAGE_TOO_LARGE
    derive(data, replace(LIMITS, max_pixels=640 * 480))


def test_heic_grid_counted_at_full_size() -> None:
    # Sixteen 256×256 tiles: each tile is within the limit, the picture is not.
    data = im.heic(im.quadrants(1024, 1024), grid_tile=256)
    assert b"grid" in data
    tight = replace(LIMITS, max_pixels=1024 * 1024 - 1)
    assert code_of(data, tight) == ErrorCode.IMAGE_TOO_LARGE
    upright_quadrants(derive(data, LIMITS), (1024, 1024))


@pytest.mark.parametrize("kind", FORMATS)
def test_no_metadata_out(kind: str) -> None:
    exif = Image.Exif()
    exif[0x010F] = "SecretCamera"
    if kind != "tiff":  # Pillow's TIFF writer cannot nest a GPS IFD
        exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0)}
    data = make(kind, im.quadrants(64, 64), exif=exif.tobytes())
    result = derive(data, LIMITS)
    assert result.thumb is not None
    for webp in (result.data, result.thumb.data):
        kinds = {kind for kind, _ in im.riff_chunks(webp)}
        assert not kinds & {b"EXIF", b"XMP ", b"ICCP"}
        assert b"SecretCamera" not in webp


def test_sixteen_bit_tiff_and_alpha() -> None:
    rgba = Image.new("RGBA", (32, 32), (0, 0, 255, 128))
    result = derive(im.save(rgba, "TIFF"), LIMITS)
    out = im.decode_webp(result.data)
    assert out.mode == "RGBA"
    pixel = out.getpixel((5, 5))
    assert isinstance(pixel, tuple) and pixel[3] in range(120, 136)
    grey16 = Image.new("I;16", (32, 32), 40000)
    assert derive(im.save(grey16, "TIFF"), LIMITS).width == 32


def test_thumbhash_is_small_and_carries_the_colour() -> None:
    red = Image.new("RGB", (800, 600), im.RED)
    result = derive(im.save(red, "PNG"), LIMITS)
    assert result.thumbhash is not None
    assert len(result.thumbhash) <= 40
    r, g, b, a = thumb_hash_to_average_rgba(base64.b64decode(result.thumbhash))
    assert r > 0.8 and g < 0.2 and b < 0.2 and a > 0.99


def test_small_image_thumb_is_not_upscaled() -> None:
    result = derive(im.save(im.quadrants(120, 80), "PNG"), LIMITS)
    assert result.thumb is not None
    assert (result.thumb.width, result.thumb.height) == (120, 80)


def test_thumb_edge_is_a_limit() -> None:
    result = derive(im.save(im.quadrants(1000, 500), "JPEG"), replace(LIMITS, thumb_edge=100))
    assert result.thumb is not None
    assert (result.thumb.width, result.thumb.height) == (100, 50)
    assert Image.open(io.BytesIO(result.thumb.data)).format == "WEBP"
