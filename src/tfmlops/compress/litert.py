"""Run a .tflite variant in LiteRT: accuracy, agreement, sizes, latency.

LiteRT applies its XNNPACK delegate by default. XNNPACK refuses some valid
INT8 graphs (seen here: the SqueezeExcite block, "failed to prepare"); such a
model then runs on LiteRT's built-in kernels and the row says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfmlops.compress.measure import gzip_bytes
from tfmlops.runtimes import TFLiteModel, accuracy, latency_ms, top1_agreement


class _BuiltinKernelsModel(TFLiteModel):
    """TFLiteModel without the default (XNNPACK) delegate (same attributes as its parent)."""

    def __init__(self, path: str, threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        self.interpreter = Interpreter(
            model_path=str(path), num_threads=threads,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self._batch = None


def load(path: str | Path, threads: int, sample: np.ndarray) -> tuple[TFLiteModel, str]:
    """(a model that ran `sample`, "xnnpack" or "builtin": the kernels it runs on)."""
    model = TFLiteModel(str(path), threads=threads)
    try:
        model.predict(sample)  # allocates: where XNNPACK refuses the graph
        return model, "xnnpack"
    except RuntimeError:
        model = _BuiltinKernelsModel(str(path), threads=threads)
        model.predict(sample)
        return model, "builtin"


def evaluate(path: Path, x: np.ndarray, y: np.ndarray, reference: np.ndarray, threads: int,
             runs: int, warmup: int) -> dict:
    """One frontier row (minus its name) from real predictions on the whole split."""
    model, kernels = load(path, threads, x[:1])
    probs = model.predict_all(x, batch=1)  # batch 1: the edge case, and safe for every graph
    timing = latency_ms(model.predict, x[:1], runs=runs, warmup=warmup)
    return {
        "accuracy": round(accuracy(probs, y), 6),
        "agreement": round(top1_agreement(probs, reference), 6),
        "bytes": path.stat().st_size,
        "gzip_bytes": gzip_bytes(path),
        "p50_ms": round(timing["p50_ms"], 4),
        "p95_ms": round(timing["p95_ms"], 4),
        "input_dtype": np.dtype(model.input_dtype).name,
        "output_dtype": np.dtype(model.output_dtype).name,
        "kernels": kernels,
    }
