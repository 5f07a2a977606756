"""The in-process pipeline: hostile inputs end in the right code, good ones in a clean WebP."""

from __future__ import annotations

import hashlib
import io
import math
import resource
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image, ImageCms, ImageDraw

from darkroom.config import load_settings
from darkroom.derive import (
    FREE_PIXELS,
    MAX_PIXELS_PER_BYTE,
    Derivative,
    Limits,
    _vips,
    check_density,
    derive,
    open_checked,
)
from darkroom.errors import DeriveError, ErrorCode
from darkroom.formats import sniff
from tests.derive import images as im

LIMITS = Limits.from_settings(load_settings())


def code_of(data: bytes, limits: Limits = LIMITS) -> ErrorCode:
    with pytest.raises(DeriveError) as info:
        derive(data, limits)
    return info.value.code


def check_webp(result: Derivative) -> Image.Image:
    assert result.sha256 == hashlib.sha256(result.data).hexdigest()
    assert result.size == len(result.data)
    decoded = im.decode_webp(result.data)
    assert decoded.size == (result.width, result.height)
    return decoded


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = im.png_zlib_bomb(30_000, 30_000)
    assert len(data) < 1_000_000  # small on disk: 900 MP once decoded
    return data


# -- refused before any decoder runs ---------------------------------------------------


def test_zero_bytes_is_invalid() -> None:
    assert code_of(b"") == ErrorCode.INVALID_IMAGE


def test_over_byte_limit() -> None:
    data = im.save(im.quadrants(64, 64), "JPEG")
    assert code_of(data, replace(LIMITS, max_bytes=len(data) - 1)) == ErrorCode.IMAGE_TOO_LARGE
    assert derive(data, replace(LIMITS, max_bytes=len(data))).width == 64


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"just some text, named photo.jpg\n" * 10, id="text"),
        pytest.param(
            b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" '
            b'height="10"><script>alert(1)</script><rect width="10" height="10"/></svg>',
            id="svg-script",
        ),
        pytest.param(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n", id="pdf"),
        pytest.param(b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", id="ps"),
        pytest.param(b"8BPS\x00\x01" + b"\x00" * 64, id="psd"),
        # A HEIF container that names no codec brand, and an ISOBMFF video.
        pytest.param(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00mif1miaf" + b"\x00" * 64, id="mif1"),
        pytest.param(b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\x00" * 64, id="mp4"),
        pytest.param(b"BM" + b"\x00" * 64, id="bmp"),
        pytest.param(b"\xff\xd8", id="two-byte-jpeg-prefix"),
    ],
)
def test_unsupported_formats(data: bytes) -> None:
    assert code_of(data) == ErrorCode.UNSUPPORTED_FORMAT


def test_sniff_allows_exactly_the_seven_formats() -> None:
    image = im.quadrants(16, 16)
    assert sniff(im.save(image, "JPEG")) == "jpeg"
    assert sniff(im.save(image, "PNG")) == "png"
    assert sniff(im.save(image, "WEBP")) == "webp"
    assert sniff(im.save(image, "GIF")) == "gif"
    assert sniff(im.save(image, "TIFF")) == "tiff"
    assert sniff(im.save(image, "AVIF")) == "avif"
    assert sniff(im.heic(image)) == "heic"
    assert sniff(b"RIFF\x00\x00\x00\x00WAVEfmt ") is None


def test_untrusted_loaders_are_blocked_in_libvips() -> None:
    vips = _vips()
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    with pytest.raises(vips.Error, match="blocked"):
        vips.Image.svgload_buffer(svg)
    with pytest.raises(vips.Error, match="blocked"):
        vips.Image.matrixload_source(vips.Source.new_from_memory(b"2 2\n1 2\n3 4\n"))
    # The generic loader finds nothing either, so no code path can reach them.
    with pytest.raises(vips.Error):
        vips.Image.new_from_buffer(svg, "")


# -- corrupt input ---------------------------------------------------------------------


def test_truncated_jpeg_is_invalid_not_grey() -> None:
    data = (im.CORPUS / "Dune.jpg").read_bytes()
    assert code_of(data[: len(data) // 2]) == ErrorCode.INVALID_IMAGE
    assert code_of(data[:600]) == ErrorCode.INVALID_IMAGE


def test_truncated_png_is_invalid() -> None:
    data = (im.CORPUS / "Flow.png").read_bytes()
    assert code_of(data[: len(data) // 2]) == ErrorCode.INVALID_IMAGE
    assert code_of(data[:40]) == ErrorCode.INVALID_IMAGE


def test_corrupt_jpeg_header() -> None:
    good = im.save(im.quadrants(64, 64), "JPEG")
    assert code_of(b"\xff\xd8\xff\xe0" + b"\xa5" * 500) == ErrorCode.INVALID_IMAGE
    # A plausible start, then the frame header smashed.
    sof = good.index(b"\xff\xc0")
    smashed = good[:sof] + b"\xff\xc0\x00\x11\x08\x00\x00\x00\x00" + good[sof + 9 :]
    assert code_of(smashed) == ErrorCode.INVALID_IMAGE


def test_png_bad_crc_is_invalid() -> None:
    data = bytearray(im.save(im.quadrants(32, 32), "PNG"))
    data[29] ^= 0xFF  # inside the IHDR CRC
    assert code_of(bytes(data)) == ErrorCode.INVALID_IMAGE


# -- limits from the header alone -------------------------------------------------------


def header_verdict(data: bytes, limits: Limits = LIMITS) -> ErrorCode | None:
    """The verdict of the header check alone, before anything is decoded."""
    try:
        open_checked(data, limits)
    except DeriveError as exc:
        return exc.code
    return None


def test_png_header_claims_100k_square() -> None:
    data = im.png_header_only(100_000, 100_000)
    assert header_verdict(data) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(data) == ErrorCode.IMAGE_TOO_LARGE


def test_zlib_bomb_rejected_fast_without_decoding(bomb: bytes) -> None:
    derive(im.save(im.quadrants(8, 8), "PNG"), LIMITS)  # libvips warm, as in the child
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert header_verdict(bomb) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(bomb) == ErrorCode.IMAGE_TOO_LARGE
    # A full decode would need ~110 MB even at 1 bit per pixel.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 20_000


def test_bomb_within_dimensions_but_over_pixels() -> None:
    # 7072 × 7071 = 50,006,112: each side is fine, the product is just over the default.
    data = im.png_zlib_bomb(7072, 7071)
    assert header_verdict(data) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(data) == ErrorCode.IMAGE_TOO_LARGE


def test_pixel_limit_boundary() -> None:
    limits = replace(LIMITS, max_pixels=100 * 100)
    assert derive(im.save(im.quadrants(100, 100), "PNG"), limits).width == 100
    assert code_of(im.save(im.quadrants(101, 100), "PNG"), limits) == ErrorCode.IMAGE_TOO_LARGE


def test_dimension_limit() -> None:
    assert code_of(im.png_header_only(16_385, 1)) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(im.png_header_only(1, 16_385)) == ErrorCode.IMAGE_TOO_LARGE
    limits = replace(LIMITS, max_dimension=64)
    assert code_of(im.save(im.quadrants(65, 8), "JPEG"), limits) == ErrorCode.IMAGE_TOO_LARGE


@pytest.fixture(scope="module")
def claims_50_mp() -> bytes:
    """A lossless WebP of one colour, 16383 × 3050: about 2 KB claiming 50 MP, just under
    every pixel and dimension limit, whose full decode costs a second of CPU."""
    data = im.flat(16_383, 3_050, ".webp", lossless=True)
    assert len(data) < 3_000
    return data


def test_tiny_file_claiming_many_pixels_is_refused_from_its_header(claims_50_mp: bytes) -> None:
    assert header_verdict(claims_50_mp) == ErrorCode.IMAGE_TOO_LARGE
    assert code_of(claims_50_mp) == ErrorCode.IMAGE_TOO_LARGE


def test_pixels_per_byte_bound_and_its_floor() -> None:
    floor_side = math.isqrt(FREE_PIXELS)
    # Up to the floor any ratio passes: a flat 16 MP lossless WebP is under 1 KB.
    at_floor = im.flat(floor_side, floor_side, ".webp", lossless=True)
    assert len(at_floor) * MAX_PIXELS_PER_BYTE < FREE_PIXELS
    assert derive(at_floor, LIMITS).width == 2048
    over = im.flat(floor_side + 1, floor_side, ".webp", lossless=True)
    assert header_verdict(over) == ErrorCode.IMAGE_TOO_LARGE
    # Above the floor, the bound itself: pixels ≤ MAX_PIXELS_PER_BYTE × bytes.
    check_density(5_000, 4_000, 20_000_000 // MAX_PIXELS_PER_BYTE)
    with pytest.raises(DeriveError) as info:
        check_density(5_000, 4_000, 20_000_000 // MAX_PIXELS_PER_BYTE - 1)
    assert info.value.code == ErrorCode.IMAGE_TOO_LARGE


@pytest.mark.parametrize(("what", "data"), [
    # A phone photo of a blank wall, as flat as a JPEG gets (64 pixels per byte).
    ("solid 4000x3000 jpeg", lambda: im.save(Image.new("RGB", (4000, 3000), (120, 160, 200)),
                                             "JPEG", quality=90)),
    # One colour over 24 MP in deflate: near zlib's best ratio (~300 pixels per byte).
    ("solid 6000x4000 png", lambda: im.flat(6_000, 4_000, ".png", compression=9)),
    # A text screenshot, in lossless WebP: far denser, and under the floor.
    ("screenshot webp", lambda: im.save(screenshot(2560, 1440), "WEBP", lossless=True)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_flat_real_images_pass_the_bound(what: str, data: Callable[[], bytes]) -> None:
    result = derive(data(), LIMITS)
    assert max(result.width, result.height) == 2048, what


def screenshot(width: int, height: int) -> Image.Image:
    shot = Image.new("RGB", (width, height), im.WHITE)
    draw = ImageDraw.Draw(shot)
    for y in range(40, height - 40, 24):
        draw.text((40, y), "a line of text in a window " * 4, fill=(0, 0, 0))
    return shot


def test_large_webp_is_decoded_shrunk() -> None:
    """libwebp scales while decoding: the image handed on is already at the output size."""
    data = im.save(im.quadrants(4096, 1024), "WEBP", quality=90)
    image, kind = open_checked(data, LIMITS)
    assert kind == "webp" and (image.width, image.height) == (2048, 512)
    result = derive(data, LIMITS)
    out = check_webp(result).convert("RGB")
    assert out.size == (2048, 512)
    assert im.close_to(out.getpixel((512, 128)), im.RED)
    assert im.close_to(out.getpixel((1536, 128)), im.GREEN)
    assert im.close_to(out.getpixel((512, 384)), im.BLUE)
    assert im.close_to(out.getpixel((1536, 384)), im.WHITE)


def test_zero_dimension_header_is_invalid() -> None:
    assert code_of(im.png_header_only(0, 10)) == ErrorCode.INVALID_IMAGE


# -- good input, correct output ---------------------------------------------------------


@pytest.mark.parametrize("path", im.CORPUS_IMAGES, ids=lambda p: p.name)
def test_corpus(path: Path) -> None:
    source = Image.open(path)
    result = derive(path.read_bytes(), LIMITS)
    check_webp(result)
    scale = min(1.0, 2048 / max(source.size))
    assert (result.width, result.height) == (  # type: ignore[comparison-overlap]
        pytest.approx(source.width * scale, abs=1),
        pytest.approx(source.height * scale, abs=1),
    )


def test_polyglot_jpeg_with_trailing_junk_is_still_a_jpeg() -> None:
    # Bytes after EOI are ignored by every JPEG decoder; the output is re-encoded from
    # pixels only, so whatever rode along (a zip, a script) does not survive.
    junk = b"PK\x03\x04" + b"<script>alert(1)</script>" * 100
    data = im.save(im.quadrants(64, 48), "JPEG", quality=95) + junk
    result = derive(data, LIMITS)
    assert (result.width, result.height) == (64, 48)
    assert b"script" not in result.data


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_applied_to_pixels(orientation: int) -> None:
    upright = im.quadrants(96, 64)
    data = im.jpeg_with_orientation(upright, orientation)
    stored = Image.open(io.BytesIO(data)).size
    assert stored == ((64, 96) if orientation >= 5 else (96, 64))
    result = derive(data, LIMITS)
    out = check_webp(result).convert("RGB")
    assert out.size == (96, 64)  # upright again: dims swapped back for 5–8
    assert im.close_to(out.getpixel((24, 16)), im.RED)
    assert im.close_to(out.getpixel((72, 16)), im.GREEN)
    assert im.close_to(out.getpixel((24, 48)), im.BLUE)
    assert im.close_to(out.getpixel((72, 48)), im.WHITE)


def test_orientation_with_downscale() -> None:
    data = im.jpeg_with_orientation(im.quadrants(3000, 2000), 6)
    out = check_webp(derive(data, LIMITS)).convert("RGB")
    assert out.size == (2048, 1365)
    assert im.close_to(out.getpixel((500, 300)), im.RED)
    assert im.close_to(out.getpixel((1500, 1000)), im.WHITE)


def test_cmyk_jpeg_without_profile() -> None:
    cmyk = Image.new("CMYK", (64, 64), (0, 255, 255, 0))  # full magenta + yellow: red
    result = derive(im.save(cmyk, "JPEG", quality=95), LIMITS)
    out = check_webp(result)
    assert out.mode == "RGB"
    r, g, b = out.getpixel((32, 32))  # type: ignore[misc]
    assert r > 180 and g < 90 and b < 90


def test_cmyk_jpeg_with_embedded_profile() -> None:
    vips = _vips()
    red = vips.Image.black(64, 64).new_from_image([255, 0, 0]).copy(interpretation="srgb")
    data = red.icc_transform("cmyk").jpegsave_buffer(Q=95)
    assert vips.Image.jpegload_buffer(data).get_typeof("icc-profile-data") != 0
    out = check_webp(derive(data, LIMITS))
    r, g, b = out.getpixel((32, 32))  # type: ignore[misc]
    assert r > 180 and g < 90 and b < 90


def test_wide_gamut_profile_is_converted_to_srgb() -> None:
    vips = _vips()
    red = vips.Image.black(32, 32).new_from_image([255, 0, 0]).copy(interpretation="srgb")
    p3 = red.icc_transform("p3", input_profile="srgb")  # same colour, P3 numbers
    data = p3.pngsave_buffer()
    out = check_webp(derive(data, LIMITS)).convert("RGB")
    assert im.close_to(out.getpixel((16, 16)), im.RED, tolerance=12)


def test_16_bit_png() -> None:
    vips = _vips()
    rgb16 = vips.Image.black(40, 30, bands=3).linear(1, [65535, 32896, 0]).cast("ushort")
    data = rgb16.copy(interpretation="rgb16").pngsave_buffer(bitdepth=16)
    assert data[24] == 16  # IHDR bit depth
    out = check_webp(derive(data, LIMITS)).convert("RGB")
    assert im.close_to(out.getpixel((20, 15)), (255, 128, 0), tolerance=8)


def test_greyscale_jpeg_and_16_bit_grey_png() -> None:
    out = check_webp(derive(im.save(Image.new("L", (30, 20), 200), "JPEG"), LIMITS))
    assert im.close_to(out.convert("RGB").getpixel((5, 5)), (200, 200, 200), tolerance=6)
    grey16 = im.save(Image.new("I;16", (30, 20), 40_000), "PNG")
    out = check_webp(derive(grey16, LIMITS)).convert("RGB")
    assert im.close_to(out.getpixel((5, 5)), (156, 156, 156), tolerance=6)


def test_png_alpha_is_kept() -> None:
    rgba = Image.new("RGBA", (3000, 1000), (255, 0, 0, 0))
    rgba.paste((0, 0, 255, 255), (0, 0, 1500, 1000))
    result = derive(im.save(rgba, "PNG"), LIMITS)
    out = check_webp(result)
    assert out.mode == "RGBA"
    assert (result.width, result.height) == (2048, 683)
    left = out.getpixel((400, 300))
    right = out.getpixel((1600, 300))
    assert isinstance(left, tuple) and isinstance(right, tuple)
    assert left[3] == 255 and im.close_to(left, im.BLUE)
    assert right[3] == 0


def test_gps_exif_xmp_and_icc_are_all_stripped() -> None:
    exif = Image.Exif()
    exif[0x010F] = "SecretCam"
    gps = exif.get_ifd(0x8825)
    gps.update({1: "N", 2: (51.0, 30.0, 0.0), 3: "E", 4: (0.0, 7.0, 0.0)})
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    base = im.save(im.quadrants(64, 64), "JPEG", exif=exif.tobytes(), icc_profile=srgb)
    xmp = b"http://ns.adobe.com/xap/1.0/\x00"
    xmp += b'<x:xmpmeta xmlns:x="adobe:ns:meta/">SECRETXMP</x:xmpmeta>'
    data = base[:2] + b"\xff\xe1" + (len(xmp) + 2).to_bytes(2, "big") + xmp + base[2:]
    vips = _vips()
    loaded = vips.Image.jpegload_buffer(data)
    assert loaded.get_typeof("exif-data") and loaded.get_typeof("xmp-data")
    assert loaded.get_typeof("icc-profile-data")

    result = derive(data, LIMITS)
    chunks = im.riff_chunks(result.data)
    kinds = {kind for kind, _ in chunks}
    assert kinds <= {b"VP8 ", b"VP8L", b"VP8X", b"ALPH"}, kinds
    assert not kinds & {b"EXIF", b"XMP ", b"ICCP"}
    for kind, body in chunks:
        if kind == b"VP8X":
            assert body[0] & 0b0010_1100 == 0  # the ICC, EXIF and XMP flags
    for secret in (b"SecretCam", b"SECRETXMP", b"GPS", b"Exif"):
        assert secret not in result.data


def test_progressive_jpeg() -> None:
    data = im.save(im.quadrants(2500, 1500), "JPEG", progressive=True, quality=90)
    result = derive(data, LIMITS)
    out = check_webp(result).convert("RGB")
    assert out.size == (2048, 1229)
    assert im.close_to(out.getpixel((200, 200)), im.RED)


def test_animated_gif_first_frame_only() -> None:
    frames = [Image.new("RGB", (50, 40), colour) for colour in (im.RED, im.GREEN, im.BLUE)]
    data = im.save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(io.BytesIO(data)).n_frames == 3  # type: ignore[attr-defined]
    result = derive(data, LIMITS)
    assert (result.width, result.height) == (50, 40)
    assert b"ANIM" not in {kind for kind, _ in im.riff_chunks(result.data)}
    out = check_webp(result).convert("RGB")
    assert im.close_to(out.getpixel((25, 20)), im.RED)


def test_webp_input() -> None:
    data = im.save(im.quadrants(3000, 1000), "WEBP", quality=90)
    result = derive(data, LIMITS)
    out = check_webp(result).convert("RGB")
    assert out.size == (2048, 683)
    assert im.close_to(out.getpixel((200, 100)), im.RED)


def test_never_upscales() -> None:
    result = derive(im.save(im.quadrants(100, 80), "PNG"), LIMITS)
    assert (result.width, result.height) == (100, 80)
    result = derive(im.save(im.quadrants(1, 1), "PNG"), LIMITS)
    assert (result.width, result.height) == (1, 1)


def test_long_edge_capped() -> None:
    result = derive(im.save(im.quadrants(3000, 5000), "JPEG"), LIMITS)
    assert (result.width, result.height) == (1229, 2048)
    small = derive(im.save(im.quadrants(3000, 5000), "JPEG"), replace(LIMITS, max_edge=500))
    assert (small.width, small.height) == (300, 500)


def test_output_is_deterministic() -> None:
    data = (im.CORPUS / "GreenTraditional.jpg").read_bytes()
    assert derive(data, LIMITS).sha256 == derive(data, LIMITS).sha256


def test_gif_frame_bomb() -> None:
    gif = bytearray(im.save(Image.new("P", (1, 1)), "GIF"))
    descriptor = gif.index(b"\x2c")  # the image separator
    for width, height in ((60_000, 60_000), (8_000, 7_000)):
        gif[6:10] = struct.pack("<HH", width, height)  # logical screen
        gif[descriptor + 5 : descriptor + 9] = struct.pack("<HH", width, height)
        assert header_verdict(bytes(gif)) == ErrorCode.IMAGE_TOO_LARGE
        assert code_of(bytes(gif)) == ErrorCode.IMAGE_TOO_LARGE
