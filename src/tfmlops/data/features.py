"""Per-image facts the data profile is built from, measured where `prepare` already
holds the pixels (`data.store.store_bytes`, in its pool workers): no second pass.

Brightness, contrast, saturation, sharpness and the perceptual hash are measured on
the stored image (its short side at `data.store.short_side`, in `data.channels`, a
stored JPEG as decoded), not on the source: a grey stored image has saturation 0.
Cheap on stored sizes (tens of microseconds at 96 px), light imports (numpy, cv2):
pool workers import this module.
"""

from __future__ import annotations

import numpy as np

# Channels of a source by its PIL mode (a palette image is colour: 3; with alpha: 4).
_MODE_CHANNELS = {"1": 1, "L": 1, "I": 1, "F": 1, "LA": 2, "La": 2, "P": 3, "RGB": 3,
                  "YCbCr": 3, "LAB": 3, "HSV": 3, "PA": 4, "RGBA": 4, "RGBa": 4, "CMYK": 4}


def mode_channels(mode: str) -> int:
    """Channels of a PIL mode as the source holds them (`I;16` and kin: 1)."""
    return _MODE_CHANNELS.get(mode, 1 if mode.startswith("I;16") else 3)


def image_features(pixels: np.ndarray) -> dict:
    """uint8 [H, W] or [H, W, 3] RGB -> brightness, contrast (RMS) and saturation (HSV's S)
    in [0, 1], sharpness (variance of the grey image's Laplacian) and `phash`."""
    import cv2

    grey = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    mean, std = cv2.meanStdDev(grey)
    saturation = 0.0
    if pixels.ndim == 3:
        saturation = float(cv2.mean(cv2.cvtColor(pixels, cv2.COLOR_RGB2HSV))[1]) / 255
    _, lap_std = cv2.meanStdDev(cv2.Laplacian(grey, cv2.CV_32F))
    return {"brightness": round(float(mean[0, 0]) / 255, 6),
            "contrast": round(float(std[0, 0]) / 255, 6),
            "saturation": round(saturation, 6),
            "sharpness": round(float(lap_std[0, 0]) ** 2, 3),
            "phash": phash(grey)}


def phash(grey: np.ndarray) -> int:
    """DCT perceptual hash: a bit per lowest-frequency coefficient (8x8) above their
    median, first row first, as an unsigned int. Near-identical images differ in few bits."""
    import cv2

    small = cv2.resize(grey, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32)
    low = cv2.dct(small)[:8, :8].ravel()
    bits = low > np.median(low)
    return int(np.packbits(bits).view(">u8")[0])
