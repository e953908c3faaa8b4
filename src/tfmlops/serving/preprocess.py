"""Request bytes or floats -> the model's float input, without TensorFlow.

The served model runs ONNX Runtime or LiteRT, so it cannot run the SavedModel's
in-graph preprocessing. This module reproduces the training path instead:
the image is decoded by the very function `prepare` decodes every image with
(`data.decode.load_pixels`: decompression-bomb headers refused, JPEG/MPO,
EXIF orientation, 16-bit scaled to 8 bits, transparency onto white, then
reduced to prepare's stored short side when the model was trained on reduced
images), then TensorFlow's bilinear resize (half-pixel centres, no
antialiasing) in NumPy, then the train split's mean and std.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from tfmlops.data.decode import ImageRejected, bilinear_taps, decoded_bytes, load_pixels, open_image


class RequestError(ValueError):
    """A request the model cannot answer; the message tells the client why."""


def decode_base64(text: object) -> bytes:
    if not isinstance(text, str) or not text.strip():
        raise RequestError("'image' must be a non-empty base64 string of PNG or JPEG bytes")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("'image' is not valid base64; send base64-encoded PNG or JPEG bytes") from None


def image_header(data: bytes) -> tuple[int, int, int]:
    """(width, height, bytes its decoding holds) the header of encoded image bytes claims;
    no pixel is decoded."""
    img = _read(data, open_image)  # opening reads the header alone
    return img.width, img.height, decoded_bytes(img)


def decode_image(data: bytes, channels: int, stored_size: int | None = None,
                 max_pixels: int | None = None) -> np.ndarray:
    """Encoded PNG/JPEG/MPO/GIF/BMP bytes -> uint8 [H, W, channels], as `prepare` stores them
    reduced to its stored short side `stored_size` (None: full size); `max_pixels` caps what
    the header may claim."""
    array = _read(data, lambda d: load_pixels(d, channels, short_side=stored_size, max_pixels=max_pixels)[0])
    return array[..., None] if array.ndim == 2 else array


def _read(data: bytes, read):
    """`read(data)`, whatever refuses or fails on the bytes said as one RequestError line."""
    if not data:
        raise RequestError("'image' is empty; send base64-encoded PNG or JPEG bytes")
    try:
        return read(data)
    except ImageRejected as exc:
        if str(exc) == "not an image":
            raise RequestError("'image' is not an image: the bytes are not PNG, JPEG, GIF or BMP") from None
        raise RequestError(f"'image' refused: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a PIL plugin's own error on crafted bytes
        raise RequestError(f"'image' refused: corrupt or unreadable ({type(exc).__name__})") from None


def image_input(data: bytes, channels: int, size: int, mean, std,
                stored_size: int | None = None, max_pixels: int | None = None) -> np.ndarray:
    """Encoded image bytes -> the float32 [size, size, C] model input the training path gives."""
    return normalize(decode_image(data, channels, stored_size, max_pixels), size, mean, std)


def resize_bilinear(image: np.ndarray, size: int) -> np.ndarray:
    """[H, W, C] (uint8 or float32) -> float32 [size, size, C], exactly what `tf.image.resize`
    (bilinear) computes on the image as float32. Only the four taps of each output pixel are
    gathered, still 8-bit, and converted: converting a 4096x4096 request image whole to
    float32 takes 4 bytes a channel of every pixel, and most of its CPU time."""
    y_lo, y_hi, y_lerp = bilinear_taps(image.shape[0], size)
    x_lo, x_hi, x_lerp = bilinear_taps(image.shape[1], size)

    def along_x(rows):  # the taps on `rows`, interpolated between their two columns
        left, right = (image[rows[:, None], cols[None, :]].astype(np.float32) for cols in (x_lo, x_hi))
        return left + (right - left) * x_lerp[None, :, None]

    top, bottom = along_x(y_lo), along_x(y_hi)
    return top + (bottom - top) * y_lerp[:, None, None]


def normalize(image_uint8: np.ndarray, size: int, mean, std) -> np.ndarray:
    """uint8 [H, W, C] of any size -> float32 [size, size, C] model input (`pipeline.preprocess`)."""
    x = resize_bilinear(image_uint8, size) / np.float32(255.0)
    return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)
