"""Request bytes or floats -> the model's float input, without TensorFlow.

The served model runs ONNX Runtime or LiteRT, so it cannot run the SavedModel's
in-graph preprocessing. This module reproduces the training path instead:
PIL decodes the image and converts its channels with the very function
`prepare` used (`data.images._to_channels`: transparency onto white, then
PIL's grayscale), then TensorFlow's bilinear resize (half-pixel centres, no
antialiasing) is done in NumPy, then the train split's mean and std.
`RequestError` carries the one-line reason a request is refused (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

import numpy as np

from tfmlops.data.images import _to_channels

FORMATS = {"PNG", "JPEG", "GIF", "BMP"}  # what the SavedModel's decode_image reads too
MAX_PIXELS = 4096 * 4096  # refuse decompression bombs before decoding them


class RequestError(ValueError):
    """A request the model cannot answer; the message tells the client why."""


def decode_base64(text: object) -> bytes:
    if not isinstance(text, str) or not text.strip():
        raise RequestError("'image' must be a non-empty base64 string of PNG or JPEG bytes")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("'image' is not valid base64; send base64-encoded PNG or JPEG bytes")\
            from None


def decode_image(data: bytes, channels: int) -> np.ndarray:
    """Encoded PNG/JPEG/GIF/BMP bytes -> uint8 [H, W, channels], as `prepare` converts them."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RequestError("'image' is empty; send base64-encoded PNG or JPEG bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                if img.format not in FORMATS:
                    raise RequestError(f"unsupported image format {img.format}; send PNG or JPEG")
                if img.width * img.height > MAX_PIXELS:
                    raise RequestError(f"image of {img.width}x{img.height} pixels is too large "
                                       f"(at most {MAX_PIXELS} pixels)")
                img.load()
                img = _to_channels(img, channels)
    except UnidentifiedImageError:
        raise RequestError("'image' is not an image: the bytes are not PNG, JPEG, GIF or BMP")\
            from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as exc:
        if isinstance(exc, RequestError):
            raise
        raise RequestError(f"'image' is a corrupt or truncated image ({str(exc)[:80]})") from None
    array = np.asarray(img, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def resize_bilinear(image: np.ndarray, size: int) -> np.ndarray:
    """float32 [H, W, C] -> [size, size, C], exactly as `tf.image.resize` (bilinear) computes it."""
    y_lo, y_hi, y_lerp = _interpolation(image.shape[0], size)
    x_lo, x_hi, x_lerp = _interpolation(image.shape[1], size)
    x_lerp = x_lerp[None, :, None]
    top = image[y_lo]
    bottom = image[y_hi]
    top = top[:, x_lo] + (top[:, x_hi] - top[:, x_lo]) * x_lerp
    bottom = bottom[:, x_lo] + (bottom[:, x_hi] - bottom[:, x_lo]) * x_lerp
    return top + (bottom - top) * y_lerp[:, None, None]


def _interpolation(in_size: int, out_size: int):
    # TensorFlow's half-pixel scaler (resize_bilinear_op.cc), in float32 like the kernel.
    scale = np.float32(in_size / out_size)
    src = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(src)
    lower = np.maximum(floor, 0).astype(np.int64)
    upper = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return lower, upper, (src - floor).astype(np.float32)


def normalize(image_uint8: np.ndarray, size: int, mean, std) -> np.ndarray:
    """uint8 [H, W, C] of any size -> float32 [size, size, C] model input (`pipeline.preprocess`)."""
    x = resize_bilinear(image_uint8.astype(np.float32), size) / np.float32(255.0)
    return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)
