"""Run a model file in its runtime (LiteRT, ONNX Runtime) and time single images.

Latency is measured the same way for every format: the same input image,
`warmup` untimed calls, then `runs` timed calls of batch 1 on a fixed thread
count; p50 and p95 in milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


class TFLiteModel:
    """A .tflite file in the maintained LiteRT interpreter; handles int8 in/out.

    LiteRT applies its XNNPACK delegate by default. XNNPACK refuses some valid
    graphs (seen here: INT8 SqueezeExcite blocks, sparse-encoded weights:
    "failed to prepare"); such a model runs on LiteRT's built-in kernels, and
    `kernels` says which ran ("xnnpack" or "builtin").
    """

    def __init__(self, path: str, threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self.kernels = "xnnpack"
        try:
            self.interpreter.allocate_tensors()  # where XNNPACK refuses a graph
        except RuntimeError:
            self.interpreter = Interpreter(
                model_path=str(path), num_threads=threads,
                experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            )
            self.interpreter.allocate_tensors()
            self.kernels = "builtin"
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self.input_dtype, self.output_dtype = self.input["dtype"], self.output["dtype"]
        self._batch = int(self.input["shape"][0])  # allocated above at the file's batch size

    def predict(self, x: np.ndarray) -> np.ndarray:
        """float32 model inputs -> float32 probabilities (quantizing as the model asks)."""
        if self._batch != len(x):
            self.interpreter.resize_tensor_input(self.input["index"],
                                                 [len(x), *self.input["shape"][1:]])
            self.interpreter.allocate_tensors()
            self._batch = len(x)
        scale, zero = self.input["quantization"]
        if self.input_dtype in (np.int8, np.uint8) and scale:
            info = np.iinfo(self.input_dtype)
            x = np.clip(np.round(x / scale + zero), info.min, info.max).astype(self.input_dtype)
        self.interpreter.set_tensor(self.input["index"], x.astype(self.input_dtype, copy=False))
        self.interpreter.invoke()
        y = self.interpreter.get_tensor(self.output["index"])
        scale, zero = self.output["quantization"]
        if self.output_dtype in (np.int8, np.uint8) and scale:
            y = (y.astype(np.float32) - zero) * scale
        return y.astype(np.float32)

    def predict_all(self, x: np.ndarray, batch: int = 1) -> np.ndarray:
        return np.concatenate([self.predict(x[i : i + batch]) for i in range(0, len(x), batch)])


class OnnxModel:
    def __init__(self, path: str, threads: int = 1):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x.astype(np.float32, copy=False)})[0]


def latency_ms(fn: Callable[[np.ndarray], object], x1: np.ndarray, runs: int,
               warmup: int) -> dict[str, float]:
    """p50/p95 of `fn(x1)` over `runs` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn(x1)
    times = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        fn(x1)
        times[i] = time.perf_counter() - start
    return {"p50_ms": float(np.percentile(times, 50) * 1e3),
            "p95_ms": float(np.percentile(times, 95) * 1e3)}


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))
