"""Training figures, each measured side by side in one process:

- throughput: images/s of the train stage's input pipeline feeding the model
  against the same model fed from in-memory tensors (target >= 0.9x);
- tracking: wall time of `tfmlops train` with MLflow logging against the same
  stage with tracking disabled, each in its own process as DVC runs it, alternated,
  best of 3 (target <= 3% extra);
- scaling: prepare + train wall time on the synthetic dataset at 1x, 4x, 16x its
  base size, with the test accuracy of each (target: growth <= 1.2x the data
  ratio, and no size scoring more than a point below 1x).

    .venv/bin/python benchmarks/training.py [throughput|tracking|scaling ...] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import save, scratch_config  # noqa: E402


class EpochTimer:
    def __init__(self, keras):
        outer = self

        class _Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                outer.start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                outer.seconds.append(time.perf_counter() - outer.start)

        self.seconds: list[float] = []
        self.callback = _Timer()


def prepared_digits(**sections):
    from tfmlops.stages import materialize, prepare

    sections["train"] = {"use_tuned": False, **sections.get("train", {})}
    cfg, workdir = scratch_config(**sections)
    materialize.run(cfg)
    prepare.run(cfg)
    return cfg, workdir


def throughput(epochs: int = 6) -> dict:
    """Steady-state images/s (epochs 2..N, median) of pipeline vs in-memory tensors."""
    import keras

    from tfmlops.data import pipeline
    from tfmlops.model.fitting import compiled_model

    cfg, _ = prepared_digits()
    prepared = pipeline.load_prepared(cfg)
    batch = cfg.train.batch_size
    steps = math.ceil(prepared.counts["train"] / batch)
    x, y = pipeline.arrays(cfg, prepared, "train")

    def fit(feed) -> float:
        keras.utils.set_random_seed(cfg.seed)
        model = compiled_model(cfg, prepared, keras, steps * epochs)
        timer = EpochTimer(keras)
        feed(model, timer.callback)
        return prepared.counts["train"] / statistics.median(timer.seconds[1:])

    import tensorflow as tf

    def train_ds():  # exactly what the train stage feeds fit (known length included)
        return pipeline.dataset(cfg, prepared, "train", batch_size=batch, training=True).apply(
            tf.data.experimental.assert_cardinality(steps))

    rates = {}
    for _ in range(2):  # alternate, so neither side gets the warmer machine
        rates.setdefault("pipeline", []).append(fit(lambda m, cb: m.fit(
            train_ds(), epochs=epochs, callbacks=[cb], verbose=0)))
        rates.setdefault("in_memory", []).append(fit(lambda m, cb: m.fit(
            x, y, batch_size=batch, shuffle=True, epochs=epochs, callbacks=[cb], verbose=0)))
    pipe, mem = max(rates["pipeline"]), max(rates["in_memory"])
    return {"pipeline_images_per_s": round(pipe, 1), "in_memory_images_per_s": round(mem, 1),
            "ratio": round(pipe / mem, 3), "target_ratio": 0.9, "met": pipe / mem >= 0.9,
            "epochs": epochs}


def tracking(epochs: int = 8, repeats: int = 3) -> dict:
    """The train stage with MLflow logging on vs off, each run in a fresh process as
    `dvc repro` runs it (so MLflow's import is paid every time, as it is there),
    alternated, best of `repeats` each."""
    import yaml

    cfg, workdir = prepared_digits(train={"use_tuned": False, "epochs": epochs,
                                          "early_stopping_patience": 0})
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["tracking"].update(enabled=True, uri=f"sqlite:///{workdir / 'mlflow.db'}")
    (workdir / "params_on.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    files = {"off": workdir / "params.yaml", "on": workdir / "params_on.yaml"}
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    seconds = {"on": [], "off": []}
    for _ in range(repeats):
        for name in ("off", "on"):  # alternated: neither side gets the quieter machine
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tfmlops", "-q", "--params", str(files[name]),
                            "train"], cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL)
            seconds[name].append(round(time.perf_counter() - start, 2))
    off_s, on_s = min(seconds["off"]), min(seconds["on"])
    extra = on_s / off_s - 1
    return {"logging_on_s": round(on_s, 2), "logging_off_s": round(off_s, 2),
            "extra": round(extra, 4), "target_extra": 0.03, "met": extra <= 0.03,
            "epochs": epochs, "repeats": repeats, "all_seconds": seconds,
            "what": "`tfmlops train` wall time, one process per run (Python, TensorFlow and "
                    "MLflow imports included, as under dvc repro)"}


def synthetic_config(images: int, epochs: int, **sections):
    """Row 6's scratch config: `images` synthetic RGB shapes (4 classes, 32 px), the
    params' own model trained `epochs` epochs without tune or early stopping."""
    cfg, _ = scratch_config(
        data={"builtin": "synthetic", "channels": 3,
              "synthetic": {"count": images, "image_size": 32, "classes": 4}},
        train={"use_tuned": False, "epochs": epochs, "early_stopping_patience": 0},
        **sections)
    return cfg


def scaling(factors=(1, 4, 16), epochs: int = 3) -> dict:
    """prepare + train on synthetic shapes at growing sizes; growth vs data ratio, with
    the test accuracy beside each time: a run that got faster by learning less fails."""
    from tfmlops.config import SyntheticConfig
    from tfmlops.stages import materialize, prepare, train

    base = SyntheticConfig().count
    rows = []
    for f in factors:
        cfg = synthetic_config(base * f, epochs)
        materialize.run(cfg)
        start = time.perf_counter()
        prepare.run(cfg)
        prep_s = time.perf_counter() - start
        start = time.perf_counter()
        metrics = train.run(cfg)
        train_s = time.perf_counter() - start
        rows.append({"factor": f, "images": base * f, "prepare_s": round(prep_s, 2),
                     "train_s": round(train_s, 2), "total_s": round(prep_s + train_s, 2),
                     "test_accuracy": round(metrics["test_accuracy"], 4)})
    first = rows[0]
    for r in rows:
        r["growth"] = round(r["total_s"] / first["total_s"], 2)
        r["growth_over_data_ratio"] = round(r["growth"] / r["factor"], 3)
        r["accuracy_vs_1x"] = round(r["test_accuracy"] - first["test_accuracy"], 4)
    worst = max(r["growth_over_data_ratio"] for r in rows)
    # More data of the same task should not score lower: one point of slack for noise.
    accuracy_kept = all(r["accuracy_vs_1x"] >= -ACCURACY_SLACK for r in rows)
    return {"rows": rows, "epochs": epochs, "worst_growth_over_data_ratio": worst,
            "target": 1.2, "time_met": worst <= 1.2, "accuracy_kept": accuracy_kept,
            "accuracy_slack": ACCURACY_SLACK, "met": worst <= 1.2 and accuracy_kept}


ACCURACY_SLACK = 0.01
# --quick: the same measurements, smaller (a check that each row runs, not a figure).
QUICK = {"throughput": {"epochs": 3}, "tracking": {"epochs": 2, "repeats": 1},
         "scaling": {"factors": (1, 2), "epochs": 1}}


MEASURES = {"throughput": throughput, "tracking": tracking, "scaling": scaling}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="*", default=list(MEASURES), choices=list(MEASURES))
    parser.add_argument("--quick", action="store_true", help="small sizes: checks it runs")
    args = parser.parse_args()
    for name in args.which:
        kwargs = QUICK[name] if args.quick else {}
        result = {"benchmark": f"training_{name}", "quick": args.quick,
                  **MEASURES[name](**kwargs)}
        path = save(f"training_{name}", result)
        print(f"training {name}: {summary(name, result)} -> {path}")


def summary(name: str, r: dict) -> str:
    ok = "met" if r["met"] else "MISSED"
    if name == "throughput":
        return (f"pipeline {r['pipeline_images_per_s']:,.0f} img/s vs in-memory "
                f"{r['in_memory_images_per_s']:,.0f} img/s = {r['ratio']}x (target >= 0.9: {ok})")
    if name == "tracking":
        return (f"logging on {r['logging_on_s']} s vs off {r['logging_off_s']} s = "
                f"{r['extra']:+.1%} (target <= +3%: {ok})")
    steps = ", ".join(f"{r2['factor']}x {r2['total_s']} s (accuracy {r2['test_accuracy']:.3f})"
                      for r2 in r["rows"])
    return (f"{steps}; worst growth/data ratio {r['worst_growth_over_data_ratio']} (<= 1.2), "
            f"accuracy kept within {r['accuracy_slack']:.0%} of 1x: {r['accuracy_kept']} ({ok})")


if __name__ == "__main__":
    main()
