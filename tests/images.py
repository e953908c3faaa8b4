"""Build small real image folders for tests: mixed formats, modes, and broken files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from tfmlops.data.builtin import write_digits


def mixed_folder(root: Path, per_class: int = 12) -> dict[str, str]:
    """Real digits re-saved as RGB JPEG, grayscale PNG, RGBA PNG, BMP and GIF at odd
    sizes, plus one file of each bad kind. Returns {relative path: expected reason}."""
    src = root.parent / f"{root.name}_src"
    write_digits(src, limit=per_class * 10 * 2)
    formats = [("JPEG", ".jpg", "RGB"), ("PNG", ".PNG", "L"), ("PNG", ".png", "RGBA"),
               ("BMP", ".bmp", "RGB"), ("GIF", ".gif", "L")]
    for cls in ("0", "1", "2"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(sorted((src / cls).glob("*.png"))[:per_class]):
            fmt, ext, mode = formats[i % len(formats)]
            img = Image.open(path).convert(mode).resize((8 + i, 10 + 2 * i))
            img.save(root / cls / f"img{i:02d}{ext}", format=fmt)
    return add_bad_files(root)


def add_bad_files(root: Path) -> dict[str, str]:
    good = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), np.uint8)).save(
        good, format="PNG")
    jpeg = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(jpeg, format="JPEG")
    bad = {
        "0/empty.png": b"",
        "0/truncated.png": good.getvalue()[: len(good.getvalue()) // 2],
        "1/notes.png": b"this is not an image at all\n" * 4,
        "1/readme.txt": b"class one\n",
        "2/cut.jpg": jpeg.getvalue()[: len(jpeg.getvalue()) // 3],
    }
    for rel, data in bad.items():
        (root / rel).write_bytes(data)
    return {
        "0/empty.png": "zero-byte file",
        "0/truncated.png": "corrupt or truncated",
        "1/notes.png": "not an image",
        "1/readme.txt": "unsupported extension .txt",
        "2/cut.jpg": "corrupt or truncated",
    }
