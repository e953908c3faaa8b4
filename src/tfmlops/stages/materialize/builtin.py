"""The built-in datasets, written as class-per-folder PNGs like a user's own images.

- digits: scikit-learn's bundled handwritten digits (1,797 real 8x8 grayscale
  images, 10 classes), shipped inside scikit-learn: no download.
- synthetic: coloured geometric shapes on noisy backgrounds (RGB), any count
  and size, deterministic from the seed; used to test RGB data and to scale
  the work 1x/4x/16x in benchmarks.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tfmlops.config import Config

SHAPES = ("circle", "square", "triangle", "cross", "ring", "bar")


def write_builtin(cfg: Config, folder: Path) -> dict[str, int]:
    """Write the dataset named by `data.builtin` into `folder` as class folders."""
    if cfg.data.builtin == "digits":
        counts = write_digits(folder)
    else:
        s = cfg.data.synthetic
        counts = write_shapes(folder, s.count, s.image_size, s.classes, cfg.seed)
    return {"images": sum(counts.values()), "classes": len(counts)}


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images 8x8 in 0..16, labels): scikit-learn's `load_digits()`, read as it reads it
    (its bundled digits.csv.gz, np.loadtxt) without importing scikit-learn, whose import
    (scipy, pandas, pyarrow) took most of this stage's time (BENCHMARKS.md, Whole pipeline)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("scikit-learn is not installed: the built-in digits ship with it")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, mode="rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)


def write_digits(folder: Path, limit: int | None = None) -> dict[str, int]:
    images, target = load_digits()
    counts: dict[str, int] = {}
    for i, (img, label) in enumerate(zip(images[:limit], target[:limit], strict=True)):
        cls = str(int(label))
        (folder / cls).mkdir(parents=True, exist_ok=True)
        pixels = np.clip(img * (255.0 / 16.0), 0, 255).astype(np.uint8)  # 0..16 -> 0..255
        Image.fromarray(pixels, mode="L").save(folder / cls / f"digit_{i:04d}.png")
        counts[cls] = counts.get(cls, 0) + 1
    return counts


def write_shapes(folder: Path, count: int, size: int, classes: int, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for i in range(count):
        label = i % classes
        shape = SHAPES[label]
        (folder / shape).mkdir(parents=True, exist_ok=True)
        draw_shape(rng, shape, size).save(folder / shape / f"{shape}_{i:06d}.png")
        counts[shape] = counts.get(shape, 0) + 1
    return counts


def draw_shape(rng: np.random.Generator, shape: str, size: int) -> Image.Image:
    background = rng.integers(0, 90, size=3)
    noise = rng.normal(0, 18, size=(size, size, 3))
    canvas = np.clip(background + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(canvas, mode="RGB")
    draw = ImageDraw.Draw(img)
    colour = tuple(int(c) for c in rng.integers(120, 256, size=3))
    r = size * rng.uniform(0.22, 0.38)
    cx, cy = size * rng.uniform(0.38, 0.62, size=2)
    box = (cx - r, cy - r, cx + r, cy + r)
    width = max(1, size // 10)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "cross":
        draw.line((cx - r, cy, cx + r, cy), fill=colour, width=width)
        draw.line((cx, cy - r, cx, cy + r), fill=colour, width=width)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=width)
    else:  # bar
        draw.rectangle((cx - r, cy - r / 4, cx + r, cy + r / 4), fill=colour)
    return img
