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

import contextlib
import tempfile
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
    """The .tflite flatbuffer of `model` for one variant (several: `converter_of`)."""
    with converter_of(model) as to_tflite:
        return to_tflite(variant, calibration)


@contextlib.contextmanager
def converter_of(model) -> Iterator[Callable[[str, np.ndarray | None], bytes]]:
    """`(variant, calibration) -> .tflite bytes` for any number of variants of one tf_keras
    model, which is saved as a SavedModel once. `TFLiteConverter.from_keras_model` saves it
    again on every conversion (most of quantize's conversion time) and then converts that
    SavedModel: from the one saved here with the same options, each file is the same bytes
    once its conversion metadata names a Keras model, as the Keras path's does. A Keras 3
    model, or one the SavedModel cannot hold, goes the Keras path each time."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="tfmlops-tflite-") as folder:
        saved = _saved_model(model, folder)

        def to_tflite(variant: str, calibration: np.ndarray | None = None) -> bytes:
            if saved is None:
                return _convert(tf.lite.TFLiteConverter.from_keras_model(model), variant, calibration)
            converter = tf.lite.TFLiteConverter.from_saved_model(saved)
            converter._metadata.environment.modelType = _KERAS_MODEL()  # noqa: SLF001 - see above
            return _convert(converter, variant, calibration)

        yield to_tflite


def _saved_model(model, folder: str) -> str | None:
    """`model` saved as TFLiteConverter's Keras path saves a tf_keras model; None for a
    Keras 3 model or when saving fails (that path then converts another way)."""
    import tensorflow as tf

    from tfmlops.compress.source import tf_keras_module

    if not isinstance(model, tf_keras_module().Model):
        return None
    try:
        tf.saved_model.save(model, folder, options=tf.saved_model.SaveOptions(save_debug_info=True))
    except Exception:  # noqa: BLE001 - as the converter's own Keras path falls back
        return None
    return folder


def _KERAS_MODEL():  # noqa: N802 - the flatbuffer schema's enum value
    from tensorflow.lite.python import conversion_metadata_schema_py_generated as schema

    return schema.ModelType.KERAS_MODEL


def _convert(converter, variant: str, calibration: np.ndarray | None) -> bytes:
    import tensorflow as tf

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
