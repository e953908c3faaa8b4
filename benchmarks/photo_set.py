"""A photo-size benchmark dataset, made, not downloaded.

Class-per-folder images of 400-1200 px, about 90% JPEG (quality 80-95, as phones
write them) and 10% PNG, whose content has the statistics that make photos costly
to decode and compress: smooth colour gradients and vignetting, blurred shapes at
several scales, oriented class textures and per-pixel sensor noise (not flat
shapes, which compress to almost nothing). Each class has its own palette and
texture, so a model can learn them. Image i depends only on (seed, i): the same
call writes the same bytes, and `start=` adds new images to an existing set.

    python benchmarks/photo_set.py OUT --images 4000 --classes 8 [--seed 0] [--start 0]

Importable: make_photo_set(out, images, classes, seed=0, start=0, workers=0,
                           sides=(400, 1200)) -> dict
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

MIN_SIDE, MAX_SIDE = 400, 1200
PNG_EVERY = 10  # one image in ten is a PNG
ROTATED_EVERY = 25  # one JPEG in 25 is stored sideways with EXIF orientation 6, as phones do
EXIF_ORIENTATION = 0x0112


def class_style(cls: int, seed: int) -> dict:
    """A class's palette (three colours) and texture (angle, period in px, strength)."""
    rng = np.random.default_rng([seed, 10_000 + cls])
    return {"palette": rng.uniform(20, 235, (3, 3)),
            "angle": float(rng.uniform(0, np.pi)),
            "period": float(rng.uniform(6, 40)),
            "strength": float(rng.uniform(8, 22))}


def image_pixels(index: int, classes: int, seed: int,
                 sides: tuple[int, int] = (MIN_SIDE, MAX_SIDE)) -> tuple[np.ndarray, int]:
    """The uint8 RGB pixels of image `index` (upright) and its class."""
    rng = np.random.default_rng([seed, index])
    cls = index % classes
    style = class_style(cls, seed)
    w, h = (int(v) for v in rng.integers(sides[0], sides[1] + 1, 2))
    # Gradients and objects are drawn at a quarter of the size, softened, then enlarged
    # smoothly: out-of-focus edges at a fraction of a full-size blur's cost.
    qw, qh = w // 4, h // 4
    gw, gh = int(rng.integers(3, 8)), int(rng.integers(3, 8))
    weights = rng.dirichlet(np.ones(3), (gh, gw))
    coarse = weights @ style["palette"] + rng.normal(0, 18, (gh, gw, 3))
    base = Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8)).resize((qw, qh), Image.BICUBIC)
    draw = ImageDraw.Draw(base)
    for _ in range(int(rng.integers(4, 14))):
        x0, y0 = rng.uniform(-0.2, 1.0) * qw, rng.uniform(-0.2, 1.0) * qh
        size = rng.uniform(0.05, 0.5) * min(qw, qh)
        colour = tuple(int(c) for c in np.clip(style["palette"][rng.integers(3)]
                                               + rng.normal(0, 40, 3), 0, 255))
        box = [x0, y0, x0 + size * rng.uniform(0.5, 2), y0 + size]
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    base = base.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.0))))
    x = np.asarray(base.resize((w, h), Image.BICUBIC), np.float32)
    # Texture: the class's oriented waves (separable: sin(a+b) = sin a cos b + cos a sin b).
    angle = style["angle"] + rng.normal(0, 0.15)
    k = 2 * np.pi / style["period"]
    ax = (np.arange(w, dtype=np.float32) * np.float32(k * np.cos(angle)))[None, :]
    by = (np.arange(h, dtype=np.float32) * np.float32(k * np.sin(angle))
          + np.float32(rng.uniform(0, 2 * np.pi)))[:, None]
    wave = np.sin(ax) * np.cos(by) + np.cos(ax) * np.sin(by)
    # Vignetting and exposure (also separable), then sensor noise.
    r2 = (((np.arange(h, dtype=np.float32) - h / 2) / h) ** 2)[:, None] \
        + (((np.arange(w, dtype=np.float32) - w / 2) / w) ** 2)[None, :]
    gain = np.float32(rng.uniform(0.8, 1.2)) * (1 - np.float32(rng.uniform(0.3, 0.9)) * r2)
    x += (style["strength"] * wave)[..., None]
    x *= gain[..., None]
    x += noise_field(rng, h, w, float(rng.uniform(1.5, 5)), rng.random() < 0.5, seed)
    return np.clip(x, 0, 255).astype(np.uint8), cls


@functools.lru_cache(maxsize=2)
def noise_tile(seed: int) -> np.ndarray:
    """Unit Gaussian noise, int8 in units of 1/32, larger than any image: each image
    takes a crop of it at its own offset (drawing fresh noise per image cost most of
    the generation time)."""
    rng = np.random.default_rng([seed, 99_999])
    side = MAX_SIDE + 256
    return np.clip(rng.normal(0, 32, (side, side, 3)), -127, 127).astype(np.int8)


def noise_field(rng: np.random.Generator, h: int, w: int, sigma: float, coarse: bool,
                seed: int) -> np.ndarray:
    """Sensor noise of standard deviation `sigma`; coarse grain is drawn at half size
    and enlarged."""
    fh, fw = ((h + 1) // 2, (w + 1) // 2) if coarse else (h, w)
    tile = noise_tile(seed)
    oy, ox = (int(v) for v in rng.integers(0, tile.shape[0] - MAX_SIDE, 2))
    noise = tile[oy : oy + fh, ox : ox + fw].astype(np.float32) * np.float32(sigma / 32.0)
    if coarse:
        noise = noise.repeat(2, 0).repeat(2, 1)[:h, :w]
    return noise


def encode_image(index: int, classes: int, seed: int,
                 sides: tuple[int, int] = (MIN_SIDE, MAX_SIDE)) -> tuple[str, bytes]:
    """(relative path, file bytes) of image `index`."""
    pixels, cls = image_pixels(index, classes, seed, sides)
    buf = io.BytesIO()
    if index % PNG_EVERY == PNG_EVERY - 1:
        # Lossless exports are usually smaller and cleaner: half size, no grain.
        img = Image.fromarray(pixels)
        small = img.resize((max(sides[0], img.width // 2), max(sides[0], img.height // 2)),
                           Image.BILINEAR)
        small.save(buf, format="PNG", optimize=False, compress_level=6)
        ext = ".png"
    else:
        quality = int(np.random.default_rng([seed, index, 1]).integers(80, 96))
        exif = Image.Exif()
        if index % ROTATED_EVERY == 3:
            # The sensor's rows: the upright photo turned 90 degrees anticlockwise; EXIF
            # orientation 6 tells a viewer to turn it clockwise to show it upright.
            pixels = np.ascontiguousarray(np.rot90(pixels))
            exif[EXIF_ORIENTATION] = 6
        Image.fromarray(pixels).save(buf, format="JPEG", quality=quality, exif=exif.tobytes())
        ext = ".jpg"
    return f"class_{cls:02d}/img_{index:06d}{ext}", buf.getvalue()


def _write(job: tuple[str, int, int, int, tuple[int, int]]) -> int:
    out, index, classes, seed, sides = job
    rel, data = encode_image(index, classes, seed, sides)
    path = Path(out) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a killed generator never leaves a half-written image
    return len(data)


def make_photo_set(out, images: int = 4000, classes: int = 8, seed: int = 0, start: int = 0,
                   workers: int = 0, sides: tuple[int, int] = (MIN_SIDE, MAX_SIDE)) -> dict:
    """Write images start..start+images-1 under `out` (class folders); existing files are
    kept. Returns {"dir", "images", "classes", "bytes"} (bytes of the whole folder)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(out), i, classes, seed, tuple(sides)) for i in range(start, start + images)]
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        for job in jobs:
            _write(job)
    else:
        with ProcessPoolExecutor(workers) as pool:
            for _ in pool.map(_write, jobs, chunksize=16):
                pass
    files = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".jpg", ".png")]
    return {"dir": str(out), "images": len(files), "classes": classes,
            "bytes": sum(p.stat().st_size for p in files)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first image to write")
    parser.add_argument("--workers", type=int, default=0, help="processes; 0 = all cores")
    args = parser.parse_args()
    result = make_photo_set(args.out, args.images, args.classes, args.seed, args.start, args.workers)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
