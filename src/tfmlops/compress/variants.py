"""The TFLite variant names: the one list config validates, tflite converts and
quantize builds. Pure names, no TensorFlow (config imports it)."""

from __future__ import annotations

FLOAT32 = "float32"  # no optimization
DYNAMIC = "dynamic"  # int8 weights, float activations at run time
FLOAT16 = "float16"  # float16 weights
INT8 = "int8"  # full integer, calibrated on a representative dataset
INT8_SPARSE = "int8_sparse"  # int8 with pruned tensors in TFLite's sparse format
QAT_INT8 = "qat_int8"  # int8 of the quantization-aware fine-tuned pruned model

BASE_VARIANTS = (FLOAT32, DYNAMIC, FLOAT16, INT8)
# Sparse encoding only pays where pruning made zeros: built for the pruned model.
PRUNED_ONLY_VARIANTS = (INT8_SPARSE,)
# What `quantize.variants` may list (QAT's variant comes from `quantize.qat` instead).
CONVERTED_VARIANTS = BASE_VARIANTS + PRUNED_ONLY_VARIANTS
# Every name `quantize.required` accepts, in frontier order.
TFLITE_VARIANTS = CONVERTED_VARIANTS + (QAT_INT8,)
QAT_VARIANT = f"pruned_{QAT_INT8}"  # the QAT model is always the pruned one
