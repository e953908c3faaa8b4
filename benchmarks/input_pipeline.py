"""Input pipeline: tfmlops' training tf.data pipeline vs a plain PIL generator.

Both read the same image files' content and produce the same normalized
float32 batches of the model's input size; the tf.data side reads them from
prepare's TFRecords (that is the pipeline training uses). Steady state:
tf.data is timed from its second epoch on (the first fills its cache), the
generator has no cache to fill. Prints the ratio and writes
reports/benchmarks/input_pipeline.json.

    .venv/bin/python benchmarks/input_pipeline.py [--epochs 20]
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


def measure(epochs: int = 20) -> dict:
    from tfmlops.data import pipeline
    from tfmlops.data.images import SUPPORTED
    from tfmlops.stages import materialize, prepare

    cfg, workdir = scratch_config()
    materialize.run(cfg)
    prepare.run(cfg)
    prepared = pipeline.load_prepared(cfg)
    batch = cfg.train.batch_size

    ds = pipeline.dataset(cfg, prepared, "train", batch_size=batch, training=True)
    for _ in ds:  # epoch 1 fills the cache
        pass
    n, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in ds:
            n += int(x.shape[0])
    tfdata_rate = n / (time.perf_counter() - start)

    root = Path(cfg.data.image_dir)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUPPORTED)
    labels = [prepared.classes.index(p.parent.name) for p in files]
    files = files[: prepared.counts["train"]]  # the same number of images per epoch
    n, start = 0, time.perf_counter()
    for epoch in range(epochs):
        for x, _ in pil_generator(files, labels, prepared.image_size, prepared.channels,
                                  prepared.mean, prepared.std, batch, cfg.seed + epoch):
            n += len(x)
    pil_rate = n / (time.perf_counter() - start)

    return {
        "benchmark": "input_pipeline",
        "images_per_epoch": prepared.counts["train"],
        "epochs_timed": epochs,
        "tfdata_images_per_s": round(tfdata_rate, 1),
        "pil_generator_images_per_s": round(pil_rate, 1),
        "ratio": round(tfdata_rate / pil_rate, 2),
        "target_ratio": 20.0,
        "met": tfdata_rate / pil_rate >= 20.0,
        "workdir": str(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    result = measure(parser.parse_args().epochs)
    path = save("input_pipeline", result)
    print(f"input pipeline: tf.data {result['tfdata_images_per_s']:,.0f} img/s vs PIL generator "
          f"{result['pil_generator_images_per_s']:,.0f} img/s = {result['ratio']}x "
          f"(target >= 20x: {'met' if result['met'] else 'MISSED'}) -> {path}")


if __name__ == "__main__":
    main()
