"""Scan a class-per-folder image tree: keep good images, quarantine bad ones, split.

Corrupt, truncated, zero-byte, non-image and unsupported files never crash
the scan and are never dropped silently: each is listed with its reason.
The split is a hash of each file's content and the seed, so it is stable
when files are added or removed (a file never changes split because another
one appeared) and identical images always share a split (no leakage).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from tfmlops.errors import DataError

SUPPORTED = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}
SPLITS = ("train", "val", "test")
MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")


@dataclass(frozen=True)
class GoodImage:
    path: Path
    label: str
    sha256: str
    width: int
    height: int
    png: bytes  # re-encoded at the channel count the params ask for


@dataclass(frozen=True)
class BadImage:
    path: Path
    label: str
    reason: str


def list_classes(root: Path) -> list[str]:
    if not root.is_dir():
        raise DataError(
            f"image folder {root} does not exist; set data.image_dir in params.yaml to a "
            "folder with one sub-folder per class"
        )
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DataError(
            f"image folder {root} has {len(classes)} class folder(s); it needs at least 2 "
            "(one sub-folder per class)"
        )
    return classes


def scan(
    root: Path, channels: int, on_file=None
) -> tuple[list[str], list[GoodImage], list[BadImage]]:
    """Validate every file under `root/<class>/`; return classes, good and bad images."""
    classes = list_classes(root)
    good: list[GoodImage] = []
    bad: list[BadImage] = []
    for cls in classes:
        files = sorted(p for p in (root / cls).rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"class folder {root / cls} is empty; add images or remove the folder")
        for path in files:
            result = check_image(path, cls, channels)
            (good if isinstance(result, GoodImage) else bad).append(result)
            if on_file is not None:
                on_file()
    empty = [c for c in classes if not any(g.label == c for g in good)]
    if empty:
        raise DataError(
            f"class folder {root / empty[0]} has no readable image; fix or remove its files"
        )
    return classes, good, bad


def check_image(path: Path, label: str, channels: int) -> GoodImage | BadImage:
    if path.suffix.lower() not in SUPPORTED:
        return BadImage(path, label, f"unsupported extension {path.suffix or '(none)'}")
    data = path.read_bytes()
    if not data:
        return BadImage(path, label, "zero-byte file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as probe:
                probe.verify()  # structure and checksums
            with Image.open(io.BytesIO(data)) as img:
                img.load()  # decodes every pixel: catches truncation
                img = _to_channels(img, channels)
    except UnidentifiedImageError:
        if data.startswith(MAGIC):  # an image's header, then garbage or nothing
            return BadImage(path, label, "corrupt or truncated: unreadable after the header")
        return BadImage(path, label, "not an image")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as exc:
        return BadImage(path, label, f"corrupt or truncated: {str(exc)[:120]}")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return GoodImage(path, label, hashlib.sha256(data).hexdigest(), img.width, img.height, buf.getvalue())


def _to_channels(img: Image.Image, channels: int) -> Image.Image:
    if img.mode in ("RGBA", "LA", "P") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)  # transparent -> white, not black
    return img.convert("L" if channels == 1 else "RGB")


def assign_split(sha256: str, seed: int, val: float, test: float) -> str:
    """A uniform number from the content hash and seed picks the split."""
    digest = hashlib.sha256(f"{seed}:{sha256}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test:
        return "test"
    if u < test + val:
        return "val"
    return "train"
