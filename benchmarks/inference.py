"""Inference: single-image p50/p95 and batch-64 throughput of every way to run the
trained model, each as a ratio to ONNX Runtime float32, measured in one process on
the same test images with one thread where the runtime lets us fix it.

Needs a reproduced project (default: this repo after `./dev pipeline`):

    .venv/bin/python benchmarks/inference.py [--repo PATH] [--runs 300]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save  # noqa: E402


def throughput(fn, xb: np.ndarray, seconds: float = 2.0) -> float:
    fn(xb)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(xb)
        n += len(xb)
    return n / (time.perf_counter() - start)


def runners(cfg) -> dict:
    """name -> callable(float32 batch) -> probabilities, for each format on disk."""
    import tensorflow as tf

    from tfmlops.model.artifacts import load_keras3, trained_model_path
    from tfmlops.runtimes import OnnxModel, TFLiteModel

    model = load_keras3(trained_model_path(cfg))
    call = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    export = Path(cfg.paths.export)
    saved_dir = next((export / "saved_model").glob("*/*/saved_model.pb")).parent
    saved = tf.saved_model.load(str(saved_dir)).signatures["serve_preprocessed"]
    saved_key = next(iter(saved.structured_outputs))
    saved_input = next(iter(saved.structured_input_signature[1]))
    tflite_dir = Path(cfg.paths.tflite)
    fp32 = TFLiteModel(tflite_dir / "trained_float32.tflite", threads=1)
    int8 = TFLiteModel(tflite_dir / "pruned_int8.tflite", threads=1)
    onnx = OnnxModel(export / "model.onnx", threads=1)
    return {
        "keras_predict": lambda x: model.predict(x, verbose=0),
        "tf_function": lambda x: call(tf.constant(x)).numpy(),
        "saved_model": lambda x: saved(**{saved_input: tf.constant(x)})[saved_key].numpy(),
        "tflite_float32": fp32.predict,
        "tflite_int8": int8.predict,
        "onnxruntime_float32": onnx.predict,
    }


def measure(repo: Path, runs: int) -> dict:
    import tensorflow as tf

    # One thread for every runtime, set before TensorFlow runs its first op.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from tfmlops.config import load_config
    from tfmlops.data import pipeline
    from tfmlops.runtimes import latency_ms

    here = Path.cwd()
    os.chdir(repo)  # params.yaml paths are relative to the repo
    try:
        cfg = load_config(repo / "params.yaml")
        x, _ = pipeline.arrays(cfg, pipeline.load_prepared(cfg), "test")
        x1, x64 = x[:1], np.resize(x, (64, *x.shape[1:]))
        served = json.loads((Path(cfg.paths.export) / "serving.json").read_text())
        rows = {}
        for name, fn in runners(cfg).items():
            lat = latency_ms(fn, x1, runs=runs if name != "keras_predict" else max(runs // 10, 20),
                             warmup=20)
            rows[name] = {**lat, "batch64_images_per_s": throughput(fn, x64)}
    finally:
        os.chdir(here)
    base = rows["onnxruntime_float32"]
    for row in rows.values():
        row["p50_vs_onnx"] = round(row["p50_ms"] / base["p50_ms"], 2)
        row["batch64_vs_onnx"] = round(row["batch64_images_per_s"] / base["batch64_images_per_s"], 2)
    served_name = {"onnx": "onnxruntime_float32", "tflite": "tflite_int8"}.get(
        served.get("runtime", ""), served.get("runtime", ""))
    served_p50 = rows.get(served_name, {}).get("p50_ms")
    return {"benchmark": "inference", "runs": runs, "formats": rows, "served": served,
            "served_p50_vs_onnx": round(served_p50 / base["p50_ms"], 2) if served_p50 else None,
            "met": bool(served_p50 and served_p50 <= base["p50_ms"] * 1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=ROOT)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    result = measure(args.repo.resolve(), args.runs)
    path = save("inference", result)
    print(f"{'format':<22}{'p50 ms':>9}{'p95 ms':>9}{'x onnx':>8}{'b64 img/s':>12}{'x onnx':>8}")
    for name, r in result["formats"].items():
        print(f"{name:<22}{r['p50_ms']:>9.3f}{r['p95_ms']:>9.3f}{r['p50_vs_onnx']:>8}"
              f"{r['batch64_images_per_s']:>12,.0f}{r['batch64_vs_onnx']:>8}")
    print(f"served ({result['served'].get('runtime')}): p50 {result['served_p50_vs_onnx']}x ONNX "
          f"Runtime float32 (target <= 1.0: {'met' if result['met'] else 'MISSED'}) -> {path}")


if __name__ == "__main__":
    main()
