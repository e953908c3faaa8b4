"""A fit's epoch and an evaluation pass of the params' model, three ways side by side in one
process: Keras 3's own BatchNormalization, the builder's (TensorFlow's fused kernel,
model/custom.py `fuse_batch_norm`) and tf_keras (which fuses on its own), in alternated
rounds; medians and best rounds, and their ratios to Keras 3's own (issue 50).

    .venv/bin/python benchmarks/batch_norm.py [--size 32 --channels 1 --classes 10]
        [--rounds 5]

Photos: `--size 96 --channels 3 --classes 8`. The data are random (the step's cost does not
depend on the pixels): 11 batches of train.batch_size, as the 1,000-photo set's train split.
Writes reports/benchmarks/batch_norm.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def models(spec, size: int, channels: int, classes: int) -> dict:
    """The params' model three ways, compiled alike: Keras 3 with Keras' own batch norm,
    Keras 3 as the builder makes it (fused), tf_keras."""
    import keras
    import tf_keras

    from tfmlops.model.builder import build_model

    keras.utils.set_random_seed(0)
    fused = build_model(spec, keras, (size, size, channels), classes)
    tf_keras.utils.set_random_seed(0)
    arms = {"keras3_own": keras.models.clone_model(fused),  # from its config: Keras' own layers
            "keras3_fused": fused,
            "tf_keras": build_model(spec, tf_keras, (size, size, channels), classes)}
    for name, model in arms.items():
        k = tf_keras if name == "tf_keras" else keras
        model.compile(optimizer=k.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from tfmlops.config import load_config

    cfg = load_config(ROOT / "params.yaml")
    batch = cfg.train.batch_size
    rng = np.random.default_rng(0)
    n = batch * 11
    x = rng.normal(size=(n, args.size, args.size, args.channels)).astype(np.float32)
    y = rng.integers(0, args.classes, size=n)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache()
    arms = models(cfg.model, args.size, args.channels, args.classes)
    for model in arms.values():  # tracing and the cache's fill stay out of the timings
        model.fit(data, epochs=1, verbose=0)
        model.evaluate(data, verbose=0)
    times = {name: {"fit": [], "evaluate": []} for name in arms}
    for r in range(args.rounds):
        for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
            started = time.perf_counter()
            arms[name].fit(data, epochs=1, verbose=0)
            times[name]["fit"].append(time.perf_counter() - started)
            started = time.perf_counter()
            arms[name].evaluate(data, verbose=0)
            times[name]["evaluate"].append(time.perf_counter() - started)
    # Medians, and the best round: on a shared 2-core VM a round can run at half speed
    # whichever arm it times (seen: 10.23 s and 5.4 s for the same arm), the best is the
    # arm's own cost.
    medians = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    bests = {name: {k: min(v) for k, v in t.items()} for name, t in times.items()}
    shape = f"{args.size}x{args.size}x{args.channels}"
    for label, figures in (("median", medians), ("best", bests)):
        base = figures["keras3_own"]
        for name, m in figures.items():
            print(f"{shape} {label:6s} {name:13s} fit epoch {m['fit']:7.3f} s "
                  f"({m['fit'] / base['fit']:.3f}x)   evaluate {m['evaluate']:7.3f} s "
                  f"({m['evaluate'] / base['evaluate']:.3f}x)")
    save("batch_norm", {"input": shape, "classes": args.classes, "batches": 11, "batch": batch,
                        "rounds": args.rounds, "seconds": times, "medians": medians,
                        "bests": bests})


if __name__ == "__main__":
    main()
