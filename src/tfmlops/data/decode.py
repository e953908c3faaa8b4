"""Read an image as a phone wrote it: one decoding for `prepare` and for serving.

`prepare` (every worker of its pool) and the served model's request decoding
both call `load_pixels`, so a photo gives the same pixels on either path:

- the header is checked before any pixel is read: a file that claims more
  pixels than PIL's decompression-bomb limit is refused with that reason;
- JPEGs (and MPO, the multi-picture JPEG many phones write; its first frame
  is the photo) decode at a reduced scale when the target is much smaller
  (`draft`), which is most of the speed on phone-size photos;
- EXIF orientation is applied, so a portrait photo is not trained sideways;
- 16-bit images are scaled to 8 bits (PIL's own `convert("L")` clips them);
- transparency goes onto white, then PIL's grayscale or RGB conversion;
- the short side is reduced to the stored size by OpenCV (`reduce_short_side`).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# What PIL opens and what the SavedModel's decode_image reads too (MPO is a JPEG). Only
# these plugins ever see the bytes (OPENERS: the JPEG plugin itself hands MPOs over):
# every other Pillow decoder stays out of reach of untrusted bytes.
FORMATS = ("PNG", "JPEG", "MPO", "GIF", "BMP")
OPENERS = ("PNG", "JPEG", "GIF", "BMP")
MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
# Signatures of common formats outside FORMATS, named in the refusal without opening them.
_OTHER_MAGIC = {b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"\x00\x00\x01\x00": "ICO",
                b"\x00\x00\x00\x0cjP  ": "JPEG2000", b"\xffO\xffQ": "JPEG2000",
                b"8BPS": "PSD", b"qoif": "QOI"}
_SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N", "I"}
# Bytes per pixel PIL holds once an image of each mode is decoded (others: 4).
MODE_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "PA": 2, "La": 2, "I;16": 2, "I;16B": 2,
              "I;16L": 2, "I;16N": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3}
AREA_FROM = 2  # reduction factor from which `reduce_short_side` averages areas
# Pixels of one band `pixels_of` composites at once, and what a band may hold per pixel:
# its crop, RGBA copy, white canvas and composite (4 each), its converted copy (PIL keeps
# RGB in 4) and that copy's array (3): 23 at most, charged with room to spare.
BAND_PIXELS, BAND_BYTES = 2**18, 32


class ImageRejected(ValueError):
    """An image that cannot be used; the message is the one-line reason."""


def open_image(data: bytes, max_pixels: int | None = None) -> Image.Image:
    """Encoded bytes -> an opened (not yet decoded) PIL image, or `ImageRejected`.

    `max_pixels` caps what the header may claim (serving's per-row budget);
    PIL's own decompression-bomb limit always applies.
    """
    if not data:
        raise ImageRejected("zero-byte file")
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            # Above the limit PIL only warns (it raises above twice the limit): refuse both.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=OPENERS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected(f"decompression bomb: the header claims more than {limit:,} pixels "
                            "(PIL's limit); resize the image") from None
    except UnidentifiedImageError:
        if data.startswith(MAGIC):  # an image's header, then garbage or nothing
            raise ImageRejected("corrupt or truncated: unreadable after the header") from None
        if other := other_format(data):
            raise ImageRejected(f"unsupported image format {other}; use PNG or JPEG") from None
        raise ImageRejected("not an image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageRejected(f"corrupt or truncated: {str(exc)[:120]}") from None
    if img.format not in FORMATS:
        raise ImageRejected(f"unsupported image format {img.format}; use PNG or JPEG")
    if max_pixels is not None and img.width * img.height > max_pixels:
        raise ImageRejected(f"image of {img.width}x{img.height} pixels is too large "
                            f"(at most {max_pixels:,} pixels)")
    return img


def other_format(data: bytes) -> str | None:
    """The name of a well-known image format outside FORMATS that `data` starts with."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[4:8] == b"ftyp" and data[8:12] in (b"heic", b"heix", b"mif1", b"avif"):
        return "HEIF/AVIF"
    return next((name for magic, name in _OTHER_MAGIC.items() if data.startswith(magic)), None)


def decoded_bytes(img: Image.Image) -> int:
    """What decoding an opened image holds in memory at its header's size and mode; one
    with transparency or a palette also holds the array it is composited into on white
    (`pixels_of`: RGB, 3 bytes per pixel) and one band's temporaries."""
    size = img.width * img.height
    held = size * MODE_BYTES.get(img.mode, 4)
    return held + size * 3 + BAND_PIXELS * BAND_BYTES if composited(img) else held


def load_pixels(data: bytes, channels: int, short_side: int | None = None,
                max_pixels: int | None = None) -> tuple[np.ndarray, str, tuple[int, int], str]:
    """Encoded bytes -> a decoded 8-bit image as uint8 [H, W] (channels 1) or [H, W, 3],
    upright, its short side reduced to `short_side` when larger (None keeps the full
    size); plus the source's format, its upright full size (width, height) and its PIL
    mode as stored (`RGB`, `P`...)."""
    img = open_image(data, max_pixels)
    fmt, (width, height), mode = img.format, img.size, img.mode
    try:
        if img.getexif().get(0x0112) in (5, 6, 7, 8):  # EXIF orientations that turn by 90
            width, height = height, width
    except (OSError, SyntaxError, ValueError):
        pass  # an unreadable EXIF block: the pixels may still be fine
    try:
        if short_side is not None and img.format in ("JPEG", "MPO"):
            # Decode at 1/2, 1/4 or 1/8 scale while both sides stay >= short_side, so
            # `reduce_short_side` still sees more pixels than it keeps (orientation-independent).
            img.draft("L" if channels == 1 else "RGB", (short_side, short_side))
        img.load()  # decodes every pixel: catches truncation
        ImageOps.exif_transpose(img, in_place=True)  # a copy per image otherwise
        pixels = pixels_of(img, channels)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageRejected(f"corrupt or truncated: {str(exc)[:120]}") from None
    if short_side is not None and min(pixels.shape[:2]) > short_side:
        pixels = reduce_short_side(pixels, short_side)
    return pixels, fmt, (width, height), mode


def reduce_short_side(pixels: np.ndarray, short_side: int) -> np.ndarray:
    """uint8 [H, W(, C)] -> its short side at `short_side` (`reduced_size`).

    Bilinear below 2x: there its two taps per axis cover each output pixel's footprint
    (at 2x they are exactly a 2x2 box); a JPEG's draft leaves less than 2x for photos up
    to 16x the stored size (a 12-megapixel one at 96 px keeps 3.9x: its draft stops at
    1/8). From 2x on, area averaging, or bilinear would skip source pixels (aliasing).
    The serving graph mirrors this choice (`serving.signatures.reduce_like_prepare`).
    """
    import cv2

    h, w = pixels.shape[:2]
    size = reduced_size((w, h), short_side)
    factor = min(h, w) / short_side
    interpolation = cv2.INTER_LINEAR if factor < AREA_FROM else cv2.INTER_AREA
    return cv2.resize(pixels, size, interpolation=interpolation)


def reduced_size(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """(w, h) scaled so that the shorter side is `short_side` (aspect kept, rounded)."""
    w, h = size
    scale = short_side / min(w, h)
    return max(short_side, round(w * scale)), max(short_side, round(h * scale))


def to_channels(img: Image.Image, channels: int) -> Image.Image:
    """Any PIL mode -> 8-bit "L" (channels 1) or "RGB" (channels 3)."""
    if img.mode in _SIXTEEN_BIT:
        img = _sixteen_to_eight(img)
    if composited(img):
        img = _onto_white(img)
    mode = "L" if channels == 1 else "RGB"
    return img if img.mode == mode else img.convert(mode)  # convert copies even to its mode


def pixels_of(img: Image.Image, channels: int, band_pixels: int | None = None) -> np.ndarray:
    """`np.asarray(to_channels(img, channels))`, the same bytes, but an image with transparency
    or a palette is composited band by band into the result: whole, its RGBA copy, a white
    canvas and the composite held 16 bytes per pixel (a 2 KB 4096x4096 palette PNG: +256 MB)."""
    if not composited(img):
        return np.asarray(to_channels(img, channels))
    mode = "L" if channels == 1 else "RGB"
    out = np.empty((img.height, img.width, *(() if channels == 1 else (3,))), np.uint8)
    rows = max(1, (band_pixels or BAND_PIXELS) // max(1, img.width))
    for top in range(0, img.height, rows):
        band = img.crop((0, top, img.width, min(top + rows, img.height)))
        out[top:top + rows] = np.asarray(_onto_white(band).convert(mode))
    return out


def composited(img: Image.Image) -> bool:
    """Whether an 8-bit image goes onto white first: it may hold transparency (alpha, a
    palette's or a colour key)."""
    if img.mode in _SIXTEEN_BIT:  # scaled to 8 bits first, without its colour key
        return False
    return img.mode in ("RGBA", "LA", "P", "PA") or "transparency" in img.info


def _onto_white(img: Image.Image) -> Image.Image:
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba)  # transparent -> white, not black


# round(v * 255 / 65535) for every 16-bit value: one 64 KiB lookup instead of
# int64 temporaries the size of the image.
_SIXTEEN_TO_EIGHT = ((np.arange(65536, dtype=np.int64) * 255 + 32767) // 65535).astype(np.uint8)


def _sixteen_to_eight(img: Image.Image) -> Image.Image:
    # A 16-bit PNG spans 0..65535; PIL's convert("L") clips at 255 (all white). Scale instead,
    # through the table, in the image's own integer width (mode "I" is clipped in place).
    values = np.asarray(img)
    if values.dtype.itemsize > 2 or values.dtype.kind == "i":
        values = np.clip(values, 0, 65535, out=values if values.flags.writeable else None)
    return Image.fromarray(_SIXTEEN_TO_EIGHT[values], "L")


def bilinear_taps(in_size: int, out_size: int):
    """(lower, upper, weight) source indices of each output pixel of `tf.image.resize`
    (bilinear): TensorFlow's half-pixel scaler (resize_bilinear_op.cc), in float32 like
    the kernel. serving's preprocessing resizes with these."""
    scale = np.float32(in_size / out_size)
    src = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(src)
    lower = np.maximum(floor, 0).astype(np.int64)
    upper = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return lower, upper, (src - floor).astype(np.float32)
