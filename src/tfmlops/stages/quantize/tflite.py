"""TFLite conversion of a tf_keras model into each quantization variant.

float32: no optimization. dynamic: weights int8, activations float at run
time. float16: weights float16. int8: full-integer (weights and activations
int8, int8 input and output), calibrated on a representative dataset.
int8_sparse: int8 whose pruned weight tensors are stored in TFLite's sparse
format (EXPERIMENTAL_SPARSITY): the zeros pruning made no longer take bytes in
the file the device loads. The same numbers as int8; XNNPACK does not run
sparse tensors, so LiteRT runs it on its built-in kernels (slower).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tfmlops.config.sections.quantize import CONVERTED_VARIANTS, FLOAT16, FLOAT32, INT8, INT8_SPARSE


def representative(images: np.ndarray) -> Callable[[], Iterator[list[np.ndarray]]]:
    """The converter's calibration generator: one image per call, as float32."""

    def gen():
        for i in range(len(images)):
            yield [images[i : i + 1].astype(np.float32)]

    return gen


def sample_indices(n_available: int, n: int, seed: int) -> np.ndarray:
    """A seeded sample of `n` distinct train indices (all classes, not the first files)."""
    return np.sort(np.random.default_rng(seed).choice(n_available, size=n, replace=False))


def convert(model, variant: str, calibration: np.ndarray | None = None) -> bytes:
    """The .tflite flatbuffer of `model` for one variant."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if variant not in CONVERTED_VARIANTS:
        raise ValueError(f"unknown TFLite variant {variant!r}")
    if variant != FLOAT32:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if variant == FLOAT16:
        converter.target_spec.supported_types = [tf.float16]
    if variant in (INT8, INT8_SPARSE):
        if calibration is None or not len(calibration):
            raise ValueError("int8 needs a representative dataset")
        if variant == INT8_SPARSE:
            converter.optimizations.append(tf.lite.Optimize.EXPERIMENTAL_SPARSITY)
        converter.representative_dataset = representative(calibration)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


def converter_message(exc: BaseException) -> str:
    """The converter's own message, on one line (its tracebacks run for pages)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    return f"{type(exc).__name__}: {text}"[:500]
