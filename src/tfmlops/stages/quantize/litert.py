"""Run a .tflite variant in LiteRT: accuracy, agreement, sizes, latency.

Each row names the kernels that ran it (`TFLiteModel.kernels`): a graph
XNNPACK refuses runs on LiteRT's built-in kernels, usually slower.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfmlops.compress.measure import gzip_bytes, sparse_tensors
from tfmlops.runtimes import TFLiteModel, accuracy, latency_ms, top1_agreement


def evaluate(path: Path, split, y: np.ndarray, reference: np.ndarray, threads: int,
             runs: int, warmup: int) -> dict:
    """One frontier row (minus its name) from real predictions on the whole split
    (`StoredSplit`, read batch by batch)."""
    model = TFLiteModel(str(path), threads=threads)
    # batch 1: the edge case, and safe for every graph
    probs = split.predict(lambda x: model.predict_all(x, batch=1))
    timing = latency_ms(model.predict, split.first[1], runs=runs, warmup=warmup)
    return {
        "accuracy": round(accuracy(probs, y), 6),
        "agreement": round(top1_agreement(probs, reference), 6),
        "bytes": path.stat().st_size,
        "gzip_bytes": gzip_bytes(path),
        "p50_ms": round(timing["p50_ms"], 4),
        "p95_ms": round(timing["p95_ms"], 4),
        "input_dtype": np.dtype(model.input_dtype).name,
        "output_dtype": np.dtype(model.output_dtype).name,
        "kernels": model.kernels,
        "sparse_tensors": sparse_tensors(path),
    }
