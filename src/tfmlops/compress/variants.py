"""The TFLite variant names, for tflite (converts), frontier and quantize (build).
They are config's (quantize.variants and quantize.required are validated against
them), so they live in config/sections/quantize.py; pure names, no TensorFlow."""

from __future__ import annotations

from tfmlops.config.sections.quantize import (
    BASE_VARIANTS,
    CONVERTED_VARIANTS,
    DYNAMIC,
    FLOAT16,
    FLOAT32,
    INT8,
    INT8_SPARSE,
    PRUNED_ONLY_VARIANTS,
    QAT_INT8,
    QAT_VARIANT,
    TFLITE_VARIANTS,
)

__all__ = ["BASE_VARIANTS", "CONVERTED_VARIANTS", "DYNAMIC", "FLOAT16", "FLOAT32", "INT8",
           "INT8_SPARSE", "PRUNED_ONLY_VARIANTS", "QAT_INT8", "QAT_VARIANT", "TFLITE_VARIANTS"]
