"""Build small real image folders for tests: mixed formats, modes, and broken files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from tfmlops.stages.materialize.builtin import write_digits


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


def photo(rng: np.random.Generator, width: int, height: int, tone: float) -> Image.Image:
    """A small photo-like RGB image: a gradient, a stripe texture and noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    x = np.stack([tone * 200 * xx / width, 255 * yy / height, 60 + 40 * np.sin(xx / 3)], -1)
    x += rng.normal(0, 12, x.shape)
    return Image.fromarray(np.clip(x, 0, 255).astype(np.uint8))


def photo_folder(root: Path, per_class: int = 12, classes: int = 3, seed: int = 0) -> list[Path]:
    """Class folders of small generated photos, 40-90 px: mostly JPEG, every fourth a PNG."""
    rng = np.random.default_rng(seed)
    written = []
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(40, 91, 2))
            img = photo(rng, w, h, tone=(c + 1) / classes)
            path = root / f"c{c}" / f"p{i:03d}{'.png' if i % 4 == 3 else '.jpg'}"
            img.save(path, quality=90) if path.suffix == ".jpg" else img.save(path)
            written.append(path)
    return written


def exif_rotated_jpeg(path: Path, width: int = 60, height: int = 30) -> Image.Image:
    """A JPEG stored `width` x `height` whose EXIF says: turn 90 degrees (orientation 6),
    as phones write portrait photos. Returns the upright image it should become."""
    from PIL import ImageOps

    img = photo(np.random.default_rng(1), width, height, 0.5)
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(path, format="JPEG", quality=95, exif=exif)
    return ImageOps.exif_transpose(Image.open(path))


def sixteen_bit_png(path: Path, width: int = 40, height: int = 30) -> np.ndarray:
    """A 16-bit grayscale PNG spanning 0..65535; returns its 16-bit values."""
    values = (np.linspace(0, 65535, width * height).reshape(height, width)).astype(np.uint16)
    Image.fromarray(values).save(path, format="PNG")  # uint16 -> mode I;16
    return values


def mpo_jpeg(path: Path, width: int = 50, height: int = 40) -> None:
    """A two-frame MPO (multi-picture JPEG, what many phones write) under a .jpg name."""
    rng = np.random.default_rng(2)
    first, second = photo(rng, width, height, 0.3), photo(rng, width, height, 0.9)
    first.save(path, format="MPO", save_all=True, append_images=[second])


def png_header(width: int, height: int, pixels: bytes | None = None) -> bytes:
    """A PNG of ~60 bytes whose header claims width x height pixels (8-bit gray); with
    `pixels`, an IDAT of those bytes follows (a header claiming more than it holds)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(pixels)) if pixels is not None else b""
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b"")


def bomb_png(path: Path, side: int = 30000) -> None:
    """A ~100-byte PNG whose header claims side x side pixels (a decompression bomb)."""
    path.write_bytes(png_header(side, side, b"\x00" * 16))


def phone_photo_folder(root: Path, images: int, classes: int = 3, sides=(300, 800)) -> dict:
    """Phone-like photos in class folders, from the photo benchmark's generator (about 90%
    JPEG, one in ten PNG, one JPEG in 25 stored sideways with EXIF orientation 6)."""
    import sys

    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from photo_set import make_photo_set

    return make_photo_set(root, images=images, classes=classes, workers=1, sides=tuple(sides))
