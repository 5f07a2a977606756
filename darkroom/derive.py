"""Untrusted image bytes in, a WebP derivative out (DESIGN §7).

`derive()` is pure and in-process; production runs it inside the decoder child
process (`darkroom.decoder_child`, started and watched by `darkroom.sandbox`) so that a
decoder crash, a runaway allocation or a hang only ever kills the child.

Order of defence, cheapest first: byte limit, magic-byte sniff (JPEG, PNG, WebP, GIF,
HEIC/HEIF, AVIF, TIFF), the format's own loader reading the header alone, dimension and
pixel limits, pixels per byte of the file (`check_density`), and only then the full decode
with errors treated as errors, shrunk while decoding where the decoder can (JPEG's DCT
scaling, libwebp's scaling) so that its cost follows the output, not the header's claim.

Decoders: libvips for everything but HEIC. The pyvips-binary wheel's libheif has no HEVC
decoder (no libde265), so HEIC/HEIF is decoded by the pillow-heif wheel, which bundles
libheif with libde265; AVIF stays with libvips (libheif with its AV1 decoder). Either way
the decode runs only in the decoder child (`darkroom.decoder_child`), never in the worker.

One decode makes both derivatives: the preview (≤ `max_edge`) is encoded from the decoded
image, the thumb (≤ `thumb_edge`) is resized from the preview, and the thumbhash
placeholder from the thumb, so the extra work is a few small resizes and one small encode.

pyvips and pillow-heif are imported lazily: the API and the worker parent import `Limits`
and `Derivative` from here and should not map any decoder into their address space.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from darkroom.errors import DeriveError, ErrorCode
from darkroom.formats import sniff
from darkroom.recipe import WEBP_EFFORT, WEBP_QUALITY

if TYPE_CHECKING:
    from darkroom.config import Settings

log = logging.getLogger("darkroom.derive")

# Loaders we trust, by libvips class name. Everything else that derives from
# VipsForeignLoad is blocked. The pyvips-binary build marks none of its loaders
# "untrusted" (it ships svg, tiff, heif, uhdr, csv, matrix, vips, raw loaders), so
# block_untrusted_set alone would block nothing: an allow-list is the real fence.
_ALLOWED_LOADER_CLASSES = (
    "VipsForeignLoadJpeg",
    "VipsForeignLoadPng",
    "VipsForeignLoadWebp",
    "VipsForeignLoadNsgif",
    # AVIF only: HEIC never reaches libvips (see the module docstring), and every loader
    # call names its format, so the sniff decides which of these a file can reach.
    "VipsForeignLoadHeif",
    "VipsForeignLoadTiff",
)

@dataclass(frozen=True)
class Limits:
    """What one derive accepts and makes. The first four are settings, whose defaults live
    in `Settings` alone: build these with `from_settings`."""

    max_bytes: int
    max_pixels: int
    max_dimension: int
    max_edge: int
    thumb_edge: int = 400

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_bytes=settings.max_upload_bytes,
            max_pixels=settings.max_pixels,
            max_dimension=settings.max_dimension,
            max_edge=settings.derivative_max_edge,
        )


@dataclass(frozen=True)
class Derivative:
    """The preview; `thumb` and `thumbhash` come with it from the same decode."""

    data: bytes
    width: int
    height: int
    sha256: str
    thumb: Derivative | None = None
    # ThumbHash (github.com/evanw/thumbhash) in standard base64: at most 25 bytes, so at
    # most 36 characters.
    thumbhash: str | None = None

    @property
    def size(self) -> int:
        return len(self.data)


_vips_lock = threading.Lock()
_vips_module: Any = None


def _vips() -> Any:
    """pyvips, configured for hostile input; loaded and configured once per process."""
    global _vips_module
    with _vips_lock:
        if _vips_module is None:
            import pyvips

            pyvips.block_untrusted_set(True)
            pyvips.operation_block_set("VipsForeignLoad", True)
            for name in _ALLOWED_LOADER_CLASSES:
                pyvips.operation_block_set(name, False)
            # The operation cache keys buffer loads on the blob; with untrusted bytes
            # and one job per call it only costs memory and risks a stale hit.
            pyvips.cache_set_max(0)
            _vips_module = pyvips
        return _vips_module


_heif_module: Any = None


def _heif() -> Any:
    """pillow-heif, configured to read the primary image and nothing else."""
    global _heif_module
    with _vips_lock:
        if _heif_module is None:
            import pillow_heif

            # Thumbnails, depth maps and auxiliary images are never used: not parsing
            # them leaves less of the file's structure in reach of the parser.
            pillow_heif.options.THUMBNAILS = False
            pillow_heif.options.DEPTH_IMAGES = False
            pillow_heif.options.AUX_IMAGES = False
            # One child per worker slot already uses every core.
            pillow_heif.options.DECODE_THREADS = 1
            _heif_module = pillow_heif
        return _heif_module


def _open_heic(vips: Any, data: bytes, limits: Limits) -> Any:
    """HEIC/HEIF through libheif + libde265: limits from the header, then one decode.

    libheif reports the primary image's size after its transformations (rotation,
    mirror, crop), and for a grid of tiles the grid's full output size, so the limits
    see what a decode would produce. The decode applies those transformations; the EXIF
    orientation of a HEIF is informative only (the HEIF spec), and no EXIF is carried to
    the pixels below, so nothing rotates twice.
    """
    heif = _heif()
    try:
        container = heif.open_heif(data, convert_hdr_to_8bit=True)
        width, height = (int(v) for v in container.size)
        mode = str(container.mode)
    except (ValueError, RuntimeError, SyntaxError, OSError, EOFError) as exc:
        raise _failed("heic", "header", exc) from None
    check_dimensions(width, height, limits)
    check_density(width, height, len(data))
    bands = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}.get(mode)
    if bands is None:
        raise DeriveError(ErrorCode.INVALID_IMAGE, f"heic mode {mode}")
    try:
        pixels = container.data  # the one full decode
        stride = int(container.stride)
        icc = container.info.get("icc_profile")
    except MemoryError:
        raise
    except (ValueError, RuntimeError, SyntaxError, OSError, EOFError) as exc:
        raise _failed("heic", "decode", exc) from None
    if stride % bands or stride < width * bands or len(pixels) < stride * height:
        raise DeriveError(ErrorCode.INVALID_IMAGE, "heic buffer")
    image = vips.Image.new_from_memory(pixels, stride // bands, height, bands, "uchar")
    if stride // bands != width:
        image = image.crop(0, 0, width, height)
    image = image.copy(interpretation="srgb" if bands >= 3 else "b-w")
    if icc:
        image.set_type(vips.GValue.blob_type, "icc-profile-data", bytes(icc))
    # pyvips keeps `pixels` referenced from every image made from this one.
    return image


def warm_up() -> None:
    """Load libvips and thumbhash before the first job, outside its time limit.

    pillow-heif is left to the first HEIC: its libheif, libde265 and x265 mappings would
    count against every child's address-space limit, HEIC or not.
    """
    _vips()
    import fast_thumbhash  # noqa: F401 - loaded for its side effect only


def _load_header(vips: Any, kind: str, data: bytes, jpeg_shrink: int = 1,
                 webp_scale: float = 1.0) -> Any:
    """Open with the sniffed format's own loader; libvips reads only the header here."""
    common: dict[str, Any] = {"access": "sequential", "fail_on": "error"}
    if kind == "jpeg":
        return vips.Image.jpegload_buffer(data, shrink=jpeg_shrink, **common)
    if kind == "png":
        return vips.Image.pngload_buffer(data, **common)
    if kind == "webp":
        return vips.Image.webpload_buffer(data, n=1, scale=webp_scale, **common)
    if kind == "gif":
        return vips.Image.gifload_buffer(data, n=1, **common)
    if kind == "avif":
        # The primary image only; libheif reports a grid's full (output) size here. Its
        # `thumbnail` option is not shrink-on-load: it swaps in the file's own thumbnail,
        # small and chosen by the file (it need not show the primary image), so AVIF's
        # cost is bounded by check_density instead.
        return vips.Image.heifload_buffer(data, n=1, **common)
    if kind == "tiff":
        return vips.Image.tiffload_buffer(data, page=0, n=1, **common)
    raise DeriveError(ErrorCode.UNSUPPORTED_FORMAT, kind)


def _jpeg_shrink(width: int, height: int, max_edge: int) -> int:
    """The largest libjpeg DCT scale that still leaves the long edge ≥ max_edge.

    Like Pillow's draft mode: decoding at 1/2, 1/4 or 1/8 is far cheaper than decoding
    in full and resizing, and the final resize then only trims the remainder.
    """
    long_edge = max(width, height)
    for shrink in (8, 4, 2):
        if long_edge // shrink >= max_edge:
            return shrink
    return 1


def _webp_scale(width: int, height: int, max_edge: int) -> float:
    """The factor libwebp decodes at so that the long edge comes out at `max_edge`.

    libwebp scales while it decodes, row by row, so the full-size image never exists:
    the memory and the resize follow the output, not the header's claim.
    """
    long_edge = max(width, height)
    return 1.0 if long_edge <= max_edge else max_edge / long_edge


# Decode cost follows the pixels, and a header may claim any number of them: a 2 KB
# lossless WebP can claim 16383 x 3050 (23,000 pixels per byte) and cost a second of CPU.
# What real images reach (pixels per byte of the file):
#   photos (the corpus, phone JPEGs)                 2 - 15
#   a solid-colour 4000 x 3000 JPEG (Pillow, libvips) 64 - 85; JPEG cannot go much
#       further: every 8 x 8 block of every channel costs a few bits at the least
#   a solid-colour 4000 x 3000 PNG or deflate TIFF   210 - 300 (deflate's 1032:1 bound
#       over 3 bytes a pixel); a text screenshot PNG 40, a near-blank one 260
#   lossless WebP, AVIF, 1-bit PNG of flat content   1,400 - 23,000: no real bound
# So above FREE_PIXELS an image needs at least one byte per MAX_PIXELS_PER_BYTE pixels:
# ten times what a JPEG can reach and three times a solid-colour PNG, while the flat
# lossless extremes are refused only when they are also large (a near-blank 8K
# screenshot in lossless WebP, say). Up to FREE_PIXELS (4096 x 4096, more than a
# 4000 x 3000 phone photo) any ratio passes: the worst such decode measured (a flat
# 16 MP AVIF, which has no shrink-on-load) stays near 0.4 s of CPU.
MAX_PIXELS_PER_BYTE = 1_000
FREE_PIXELS = 4096 * 4096


def check_density(width: int, height: int, size: int) -> None:
    """Refuse, before any decode, a header that claims more pixels than its bytes can
    plausibly hold (`image_too_large`: it is too large for its file)."""
    pixels = width * height
    if pixels > FREE_PIXELS and pixels > MAX_PIXELS_PER_BYTE * size:
        raise DeriveError(ErrorCode.IMAGE_TOO_LARGE,
                          f"{width}x{height} in {size} bytes")


def check_size(data: bytes, limits: Limits) -> str:
    """Byte limit and sniff: the checks that need no decoder. Returns the format."""
    if not data:
        # An empty upload is a broken upload, not a format we refuse.
        raise DeriveError(ErrorCode.INVALID_IMAGE, "empty input")
    if len(data) > limits.max_bytes:
        raise DeriveError(ErrorCode.IMAGE_TOO_LARGE, f"{len(data)} bytes")
    kind = sniff(data)
    if kind is None:
        raise DeriveError(ErrorCode.UNSUPPORTED_FORMAT, f"magic {data[:12].hex()}")
    return kind


def check_dimensions(width: int, height: int, limits: Limits) -> None:
    if width < 1 or height < 1:
        raise DeriveError(ErrorCode.INVALID_IMAGE, f"{width}x{height}")
    if width > limits.max_dimension or height > limits.max_dimension:
        raise DeriveError(ErrorCode.IMAGE_TOO_LARGE, f"{width}x{height}")
    if width * height > limits.max_pixels:
        raise DeriveError(ErrorCode.IMAGE_TOO_LARGE, f"{width}x{height} pixels")


# How libvips, libjpeg, libspng, glib and libheif word an allocation failure under
# RLIMIT_AS. A worker thread a decoder cannot start (its stack is address space too) is
# the same: the child's limits failed, not the file. libheif answers "unexpected C++
# exception" for what its own code does not catch: std::bad_alloc, or std::system_error
# from a thread it could not start; never a property of the file's bytes.
_OOM_MARKERS = ("out of memory", "insufficient memory", "memory allocation", "failed to allocate",
                "error creating thread", "unexpected c++ exception")


# The detail of every failure that was the decoder running out of memory: the parent
# replaces such a child (`darkroom.sandbox`).
OUT_OF_MEMORY = "out of memory"


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _OOM_MARKERS)


def _ours(exc: BaseException, stage: str) -> str:
    """The detail of a failure of ours: `OUT_OF_MEMORY` when it was one."""
    return OUT_OF_MEMORY if _is_out_of_memory(exc) else stage


def _failed(kind: str, stage: str, exc: BaseException) -> DeriveError:
    """A decoder's error reading the header or the pixels: the file's fault, unless the
    decoder ran out of memory (at any stage: libvips' WebP loader allocates the whole
    frame while reading the header, libjpeg its markers), which is the child's."""
    if _is_out_of_memory(exc):
        log.warning("%s %s ran out of memory: %s", kind, stage, exc)
        return DeriveError(ErrorCode.PROCESSING_FAILED, OUT_OF_MEMORY)
    log.info("%s %s failed: %s", kind, stage, exc)
    return DeriveError(ErrorCode.INVALID_IMAGE, f"{kind} {stage}")


def open_checked(data: bytes, limits: Limits) -> tuple[Any, str]:
    """Sniff, read the header, enforce the limits, and reopen with shrink-on-load.

    Returns a lazy, sequential image: nothing has been decoded yet, except for HEIC,
    which libheif decodes whole (after the same limits).
    """
    vips = _vips()
    kind = check_size(data, limits)
    if kind == "heic":
        return _open_heic(vips, data, limits), kind
    try:
        header = _load_header(vips, kind, data)
    except vips.Error as exc:
        raise _failed(kind, "header", exc) from None
    width, height = int(header.width), int(header.height)
    check_dimensions(width, height, limits)
    check_density(width, height, len(data))
    if kind == "webp":
        scale = _webp_scale(width, height, limits.max_edge)
        if scale < 1.0:
            try:
                header = _load_header(vips, kind, data, webp_scale=scale)
            except vips.Error as exc:
                raise _failed(kind, "header", exc) from None
    if kind == "jpeg":
        shrink = _jpeg_shrink(width, height, limits.max_edge)
        if shrink > 1:
            try:
                header = _load_header(vips, kind, data, jpeg_shrink=shrink)
            except vips.Error as exc:
                raise _failed(kind, "header", exc) from None
    return header, kind


def decode_resized(data: bytes, limits: Limits) -> Any:
    """Everything up to the encoder: an upright sRGB 8-bit image in memory.

    Exposed so the benchmark can time decode+resize apart from encode.
    """
    vips = _vips()
    image, kind = open_checked(data, limits)
    try:
        if max(image.width, image.height) > limits.max_edge:
            # thumbnail_image premultiplies alpha around the resample, which a plain
            # resize does not; the box is square so orientation does not matter yet.
            image = image.thumbnail_image(
                limits.max_edge, height=limits.max_edge, size="down", no_rotate=True
            )
        # The one full decode happens here. It also ends the sequential pipeline so
        # that autorot may read in any order, and it separates decode errors (the
        # input's fault) from encode errors (ours).
        image = image.copy_memory()
    except vips.Error as exc:
        raise _failed(kind, "decode", exc) from None
    try:
        image = image.autorot()
        image = _to_srgb(vips, image)
    except vips.Error as exc:
        log.warning("colour/orientation failed (%s): %s", kind, exc)
        raise DeriveError(ErrorCode.PROCESSING_FAILED, _ours(exc, "colour conversion")) from None
    return image


def _to_srgb(vips: Any, image: Any) -> Any:
    """Colour-manage to 8-bit sRGB, keeping any alpha band."""
    interpretation = str(image.interpretation)
    has_icc = image.get_typeof("icc-profile-data") != 0
    if interpretation == "cmyk":
        # A CMYK JPEG without a profile still needs one to mean anything; libvips
        # ships a generic CMYK profile as "cmyk".
        image = image.icc_transform(
            "srgb", input_profile="cmyk", embedded=has_icc, intent="perceptual"
        )
    elif has_icc:
        try:
            image = image.icc_transform("srgb", embedded=True, intent="perceptual")
        except vips.Error as exc:
            # A broken or mismatched embedded profile should not reject a photo that
            # decodes fine; fall back to treating the pixels as sRGB.
            log.info("ignoring unusable ICC profile: %s", exc)
    if str(image.interpretation) != "srgb" or str(image.format) != "uchar":
        image = image.colourspace("srgb")
    if str(image.format) != "uchar":
        image = image.cast("uchar")
    return image


def encode(image: Any) -> bytes:
    """WebP with no metadata at all: keep='none' drops EXIF, XMP and the ICC profile."""
    data: bytes = image.webpsave_buffer(Q=WEBP_QUALITY, effort=WEBP_EFFORT, keep="none")
    return data


# ThumbHash encodes at most 100×100 pixels; more only costs time.
_THUMBHASH_EDGE = 100


def thumbhash(image: Any) -> str:
    """The ThumbHash of an sRGB 8-bit image, standard base64 (≤ 36 characters)."""
    from fast_thumbhash import rgba_to_thumb_hash

    if max(image.width, image.height) > _THUMBHASH_EDGE:
        image = image.thumbnail_image(
            _THUMBHASH_EDGE, height=_THUMBHASH_EDGE, size="down", no_rotate=True
        )
    if image.bands == 3:
        image = image.bandjoin_const([255])
    elif image.bands != 4:  # _to_srgb leaves 3 or 4 bands; anything else is a bug here
        raise DeriveError(ErrorCode.PROCESSING_FAILED, f"thumbhash of {image.bands} bands")
    rgba = bytes(image.write_to_memory())
    digest = bytes(rgba_to_thumb_hash(int(image.width), int(image.height), rgba))
    return base64.b64encode(digest).decode("ascii")


def _webp(image: Any) -> Derivative:
    data = encode(image)
    return Derivative(
        data=data,
        width=int(image.width),
        height=int(image.height),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def derive(data: bytes, limits: Limits) -> Derivative:
    """Untrusted image bytes to the preview, its thumb and thumbhash; or `DeriveError`."""
    vips = _vips()
    try:
        image = decode_resized(data, limits)
        try:
            preview = _webp(image)
            if max(image.width, image.height) > limits.thumb_edge:
                # From the decoded preview, never the original: no second decode.
                small = image.thumbnail_image(
                    limits.thumb_edge, height=limits.thumb_edge, size="down", no_rotate=True
                ).copy_memory()
            else:
                small = image
            thumb = _webp(small)
            placeholder = thumbhash(small)
        except vips.Error as exc:
            log.warning("webp encode failed: %s", exc)
            raise DeriveError(ErrorCode.PROCESSING_FAILED, _ours(exc, "encode")) from None
        return replace(preview, thumb=thumb, thumbhash=placeholder)
    except DeriveError:
        raise
    except MemoryError:
        # The header limits passed, so a blow-up is the decoder misbehaving or the
        # memory limit being set too tight: not something the uploader can fix.
        raise DeriveError(ErrorCode.PROCESSING_FAILED, OUT_OF_MEMORY) from None
    except Exception as exc:
        log.exception("unexpected derive failure")
        raise DeriveError(ErrorCode.PROCESSING_FAILED, type(exc).__name__) from None
