"""Building every TFLite variant of quantize: conversion, optional QAT, the metrics.

The stage (stages/quantize/__init__.py) decides what to build and evaluates it; this module
converts each source x variant (a converter refusal is reported per variant, not
raised), fine-tunes and converts the QAT model, and writes quantize.json's figures.

QAT is pruning-preserving quantization-aware training of the pruned model (tfmot).
Every layer tfmot's default 8-bit registry supports is annotated (plus
BatchNormalization, which tfmot folds into the convolution before it); the
rest stay float and are named. `Default8BitPrunePreserveQuantizeScheme`
keeps the pruned zeros at zero through the fine-tune. BatchNormalization is
frozen (inference mode): `prune` re-estimated its statistics exactly, and a
short fine-tune would leave them trailing behind the weights.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from tfmlops import profiling
from tfmlops.artifacts import MODEL_FILE
from tfmlops.compress import source
from tfmlops.compress.measure import gzip_bytes
from tfmlops.config.sections.quantize import INT8, QAT_VARIANT
from tfmlops.stages.quantize.frontier import SOURCES, ratio, variants

log = logging.getLogger(__name__)


def convert_all(models: dict, calibration, out: Path, q, failed: dict) -> list[str]:
    """Every source x variant of `quantize.variants` converted into `out` (names of those
    built); one log line each."""
    from tfmlops.stages.quantize import tflite

    planned = [(src, variant) for src in SOURCES for variant in variants(src, q.variants)]
    total = len(planned) + (1 if q.qat else 0)  # QAT's variant comes after these
    built = []
    k = 0
    for src in SOURCES:
        with tflite.converter_of(models[src]) as to_tflite:  # the source saved once
            for variant in variants(src, q.variants):
                k, name = k + 1, f"{src}_{variant}"
                log.info("quantize: [%d/%d] converting %s", k, total, name)
                try:
                    data = to_tflite(variant, calibration)
                except Exception as exc:  # noqa: BLE001 - reported per variant, see `required`
                    failed[name] = tflite.converter_message(exc)
                    log.info("quantize: [%d/%d] %s not built: %s", k, total, name, failed[name])
                    continue
                (out / f"{name}.tflite").write_bytes(data)
                built.append(name)
    return built


def qat_variant(cfg, tcfg, prepared, pruned, calibration, out: Path, failed: dict, built: list,
                profile_dir: Path | None):
    """Optional QAT INT8 of the pruned model; a failure is reported, not raised."""
    if not cfg.quantize.qat:
        return None
    from tfmlops.data import pipeline
    from tfmlops.model.custom import make_loss
    from tfmlops.progress import keras_verbose
    from tfmlops.stages.quantize import tflite

    keras = source.tf_keras_module()
    report: dict = {"scheme": "Default8BitPrunePreserveQuantizeScheme"}
    try:
        model, left_float = quantize_aware(pruned, keras)
        report["left_float"] = left_float
        train = pipeline.dataset(cfg, prepared, "train", batch_size=tcfg.train.batch_size,
                                 training=True)
        steps = math.ceil(prepared.counts["train"] / tcfg.train.batch_size)
        profile = profiling.keras_profile_batch(cfg, steps)
        callbacks = [keras.callbacks.TensorBoard(
            str(profile_dir), profile_batch=profile)] if profile and profile_dir else []
        model.compile(optimizer=keras.optimizers.Adam(cfg.quantize.qat_learning_rate),
                      loss=make_loss(tcfg.train.loss, prepared.num_classes, keras),
                      metrics=["accuracy"])
        history = model.fit(train, epochs=cfg.quantize.qat_epochs, verbose=keras_verbose(),
                            callbacks=callbacks)
        report["fit"] = {k: float(v[-1]) for k, v in history.history.items()}
        data = tflite.convert(model, INT8, calibration)
    except Exception as exc:  # noqa: BLE001 - an unsupported model is reported
        failed[QAT_VARIANT] = tflite.converter_message(exc)
        report["error"] = failed[QAT_VARIANT]
        return report
    (out / f"{QAT_VARIANT}.tflite").write_bytes(data)
    built.append(QAT_VARIANT)
    return report


def quantize_aware(model, keras) -> tuple[object, list[str]]:
    """(the QAT model, names of weighted layers left unquantized)."""
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry_module,
    )

    from tfmlops.model.custom import custom_objects

    q = tfmot.quantization.keras
    registry = registry_module.Default8BitQuantizeRegistry()
    left_float: list[str] = []

    def annotate(layer):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False  # carried into the clone by its config
        if registry.supports(layer) or isinstance(layer, keras.layers.BatchNormalization):
            return q.quantize_annotate_layer(layer)
        if layer.weights:
            left_float.append(layer.name)
        return layer

    annotated = keras.models.clone_model(model, clone_function=annotate)
    with q.quantize_scope(custom_objects(keras)):
        qat_model = q.quantize_apply(
            annotated, tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme())
    return qat_model, left_float


def quantize_metrics(cfg, details: dict, failed: dict, reference_accuracy: float, edge: dict,
                     qat_report) -> dict:
    """quantize.json: per-variant figures, the edge pick and the ratios the targets name."""

    def get(name, key):
        return details.get(name, {}).get(key)

    keras_gzip = gzip_bytes(Path(cfg.paths.train) / MODEL_FILE)
    out = {
        "edge_variant": edge["variant"],
        "edge_within_budget": edge["within_budget"],
        "reference_accuracy": round(reference_accuracy, 6),
        "accuracy_budget": cfg.quantize.accuracy_budget,
        "variants": {name: {**d, "accuracy_delta": round(d["accuracy"] - reference_accuracy, 6)}
                     for name, d in details.items()},
        "failed": failed,
        "keras_model_gzip_bytes": keras_gzip,
    }
    for src in SOURCES:
        out[f"{src}_int8_vs_float32_bytes"] = ratio(get(f"{src}_float32", "bytes"),
                                                    get(f"{src}_int8", "bytes"))
    out["pruned_int8_sparse_vs_float32_bytes"] = ratio(get("pruned_float32", "bytes"),
                                                       get("pruned_int8_sparse", "bytes"))
    # Prune + INT8 against the trained float32 model: the gzip of the trained
    # model.keras file, and (weights only, no optimizer state or Keras metadata)
    # the gzip of the trained float32 .tflite.
    out["keras_gzip_vs_pruned_int8_gzip"] = ratio(keras_gzip, get("pruned_int8", "gzip_bytes"))
    out["trained_float32_gzip_vs_pruned_int8_gzip"] = ratio(get("trained_float32", "gzip_bytes"),
                                                            get("pruned_int8", "gzip_bytes"))
    if qat_report is not None:
        out["qat"] = qat_report
    return out
