"""Input pipeline: tfmlops' training tf.data pipeline vs a plain PIL generator.

Both read the same image files' content and produce the same normalized
float32 batches of the model's input size; the tf.data side reads them from
prepare's TFRecords (that is the pipeline training uses). Steady state:
tf.data is timed from its second epoch on (the first fills its cache), the
generator has no cache to fill. That ratio measures mostly tf.data's `.cache()`;
the same ratio with the cache off (every epoch decodes the TFRecords, as data too
big to cache gets) is measured beside it. The three are alternated over three rounds
and each side's best round counts. Prints the ratios and writes
reports/benchmarks/input_pipeline.json.

    .venv/bin/python benchmarks/input_pipeline.py [--epochs 20] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import save, scratch_config  # noqa: E402


def pil_generator(files, labels, size, channels, mean, std, batch, seed):
    """What a hand-written loader does: open, convert, resize, normalize, batch."""
    from PIL import Image

    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    for start in range(0, len(order), batch):
        xs = []
        for i in order[start : start + batch]:
            with Image.open(files[i]) as img:
                img = img.convert("L" if channels == 1 else "RGB").resize((size, size), Image.BILINEAR)
                x = np.asarray(img, np.float32) / 255.0
            xs.append(((x.reshape(size, size, channels)) - mean) / std)
        yield np.stack(xs), np.asarray([labels[i] for i in order[start : start + batch]])


def tfdata_rate(ds, epochs: int, warm: bool) -> float:
    """Images/s over `epochs` epochs; `warm`: one untimed epoch first (fills a cache)."""
    if warm:
        for _ in ds:
            pass
    n, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in ds:
            n += int(x.shape[0])
    return n / (time.perf_counter() - start)


def pil_rate(files, labels, prepared, batch: int, epochs: int, seed: int) -> float:
    n, start = 0, time.perf_counter()
    for epoch in range(epochs):
        for x, _ in pil_generator(files, labels, prepared.image_size, prepared.channels,
                                  prepared.mean, prepared.std, batch, seed + epoch):
            n += len(x)
    return n / (time.perf_counter() - start)


def measure(epochs: int = 20, uncached_epochs: int = 3, rounds: int = 3) -> dict:
    """tf.data served from its cache, and decoding every epoch (cache off: what data
    too big for memory or disk gets), each against the PIL generator; the three are
    alternated for `rounds` rounds and each side's best round counts (a round of the
    cached side lasts a fraction of a second: one round alone moved the ratio from 18x
    to 31x between runs on the same machine)."""
    from tfmlops.data import pipeline
    from tfmlops.stages import materialize, prepare
    from tfmlops.stages.prepare.images import SUPPORTED

    cfg, workdir = scratch_config()
    materialize.run(cfg)
    prepare.run(cfg)
    prepared = pipeline.load_prepared(cfg)
    batch = cfg.train.batch_size
    root = Path(cfg.data.image_dir)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUPPORTED)
    labels = [prepared.classes.index(p.parent.name) for p in files]
    files = files[: prepared.counts["train"]]  # the same number of images per epoch
    pil_epochs = max(uncached_epochs, 2)

    cached_ds = pipeline.dataset(cfg, prepared, "train", batch_size=batch, training=True)
    uncached_ds = pipeline.dataset(cfg, prepared, "train", batch_size=batch, training=True,
                                   cache="off")
    runs = {"cached": [], "uncached": [], "pil": []}
    for r in range(rounds):
        # The first round's untimed epoch fills the cache (and starts tf.data); without a
        # cache every epoch decodes, after that one epoch of start-up too.
        runs["cached"].append(tfdata_rate(cached_ds, epochs, warm=r == 0))
        runs["uncached"].append(tfdata_rate(uncached_ds, uncached_epochs, warm=r == 0))
        runs["pil"].append(pil_rate(files, labels, prepared, batch, pil_epochs, cfg.seed))
    cached, uncached, pil_rate_best = (max(runs[k]) for k in ("cached", "uncached", "pil"))

    return {
        "benchmark": "input_pipeline",
        "images_per_epoch": prepared.counts["train"],
        "epochs_timed": epochs,
        "uncached_epochs_timed": uncached_epochs,
        "pil_epochs_timed": pil_epochs,
        "rounds": rounds,
        "all_rounds_images_per_s": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        "tfdata_images_per_s": round(cached, 1),
        "tfdata_uncached_images_per_s": round(uncached, 1),
        "pil_generator_images_per_s": round(pil_rate_best, 1),
        "ratio": round(cached / pil_rate_best, 2),
        "uncached_ratio": round(uncached / pil_rate_best, 2),
        "what": "ratio: mostly tf.data's .cache() (epochs 2..N are served from memory); "
                "uncached_ratio: decoding the TFRecords every epoch",
        "target_ratio": 20.0,
        "met": cached / pil_rate_best >= 20.0,
        "workdir": str(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 epochs cached, 1 uncached")
    args = parser.parse_args()
    result = measure(3, 1, rounds=1) if args.quick else measure(args.epochs)
    path = save("input_pipeline", result)
    print(f"input pipeline: tf.data {result['tfdata_images_per_s']:,.0f} img/s vs PIL generator "
          f"{result['pil_generator_images_per_s']:,.0f} img/s = {result['ratio']}x, mostly its cache "
          f"(target >= 20x: {'met' if result['met'] else 'MISSED'}); cache off "
          f"{result['tfdata_uncached_images_per_s']:,.0f} img/s = {result['uncached_ratio']}x "
          f"-> {path}")


if __name__ == "__main__":
    main()
