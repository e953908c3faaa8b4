"""A class-per-folder image tree: list its files, validate them, split them.

Corrupt, truncated, zero-byte, non-image and unsupported files never crash
validation and are never dropped silently: each is listed with its reason.
The split is a hash of each file's content and the seed, so it is stable
when files are added or removed (a file never changes split because another
one appeared) and identical images always share a split (no leakage).
Decoding itself is `data.decode.load_image`, shared with serving.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from tfmlops.data.decode import ImageRejected, load_image, to_channels
from tfmlops.errors import DataError

SUPPORTED = {".png", ".jpg", ".jpeg", ".mpo", ".bmp", ".gif"}
SPLITS = ("train", "val", "test")

# The name serving/preprocess.py imports; the function lives in data/decode.py.
_to_channels = to_channels


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


def list_files(root: Path) -> tuple[list[str], list[tuple[Path, str]]]:
    """Classes and every (file, class) under `root/<class>/`, in a fixed order."""
    classes = list_classes(root)
    files: list[tuple[Path, str]] = []
    for cls in classes:
        found = sorted(p for p in (root / cls).rglob("*") if p.is_file() and not p.name.startswith("."))
        if not found:
            raise DataError(f"class folder {root / cls} is empty; add images or remove the folder")
        files.extend((p, cls) for p in found)
    return classes, files


def unsupported(path: Path) -> str | None:
    """The reason a file is refused by its name alone, if it is."""
    if path.suffix.lower() not in SUPPORTED:
        return f"unsupported extension {path.suffix or '(none)'}"
    return None


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_empty_classes(root: Path, classes: list[str], good_labels: set[str]) -> None:
    empty = [c for c in classes if c not in good_labels]
    if empty:
        raise DataError(
            f"class folder {root / empty[0]} has no readable image; fix or remove its files"
        )


def scan(
    root: Path, channels: int, on_file=None
) -> tuple[list[str], list[GoodImage], list[BadImage]]:
    """Validate every file under `root/<class>/` at full size, in memory (small folders;
    `prepare` streams instead); return classes, good and bad images."""
    classes, files = list_files(root)
    good: list[GoodImage] = []
    bad: list[BadImage] = []
    for path, cls in files:
        result = check_image(path, cls, channels)
        (good if isinstance(result, GoodImage) else bad).append(result)
        if on_file is not None:
            on_file()
    check_empty_classes(root, classes, {g.label for g in good})
    return classes, good, bad


def check_image(path: Path, label: str, channels: int) -> GoodImage | BadImage:
    reason = unsupported(path)
    if reason:
        return BadImage(path, label, reason)
    data = path.read_bytes()
    try:
        img = load_image(data, channels)
    except ImageRejected as exc:
        return BadImage(path, label, str(exc))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return GoodImage(path, label, hashlib.sha256(data).hexdigest(), img.width, img.height, buf.getvalue())


def assign_split(sha256: str, seed: int, val: float, test: float) -> str:
    """A uniform number from the content hash and seed picks the split."""
    digest = hashlib.sha256(f"{seed}:{sha256}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test:
        return "test"
    if u < test + val:
        return "val"
    return "train"
