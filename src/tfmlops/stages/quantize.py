"""Stage `quantize`: TFLite variants of the pruned and the trained model, one frontier.

Runs with TF_USE_LEGACY_KERAS=1 (set by the CLI). For each source (the pruned
model, and the unpruned trained model for comparison) it builds float32,
dynamic-range, float16 and full-integer INT8 (int8 in and out, calibrated on
`quantize.representative_samples` train images drawn through the input
pipeline), and of the pruned model also INT8 in TFLite's sparse encoding; with
`quantize.qat`, also a pruning-preserving QAT INT8 model.
A variant the converter refuses is reported with the converter's message;
only the variants in `quantize.required` (of the pruned model) fail the stage.

Every variant runs in LiteRT on the whole test split (read in batches): accuracy, top-1
agreement with the Keras reference (the trained model's predictions), bytes raw and
gzipped, batch-1 latency p50/p95 (same image, `quantize.threads`).
The edge variant is the smallest (`quantize.edge_pick: fastest`: the lowest
p50) within `quantize.accuracy_budget` of the reference.

Outputs: `paths.tflite/<source>_<variant>.tflite`, `edge.json`, `frontier.png`,
`mlflow_run.json` (staged, swapped in whole); `reports/quantize.json`, `reports/frontier.csv`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.compress import source
from tfmlops.compress.frontier import (
    FRONTIER_COLUMNS,
    QAT_VARIANT,
    SOURCES,
    ratio,
    required_names,
    select_edge,
    variants,
)
from tfmlops.compress.measure import gzip_bytes
from tfmlops.compress.variants import INT8
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import staging_dir, swap_in, write_csv, write_json
from tfmlops.model.artifacts import trained_model_path

log = logging.getLogger(__name__)

STAGE = "quantize"


def run(cfg: Config) -> dict:
    tcfg = _check(cfg)  # bad input fails here, before TensorFlow loads

    from tfmlops.compress.plot import frontier_png
    from tfmlops.data import pipeline

    prepared = pipeline.load_prepared(cfg)
    out = staging_dir(cfg.paths.tflite)
    upstream = {"prepare": cfg.paths.prepared, "train": cfg.paths.train,
                "prune": cfg.paths.pruned}
    params = {"quantize": cfg.to_dict()["quantize"], "model": tcfg.to_dict()["model"]}
    # QAT's fine-tune is the one part worth a trace; its folder is this run's.
    qat_profile = profiling.fresh_profile_dir(cfg, STAGE) if (
        cfg.quantize.qat and cfg.profiling.enabled) else None
    with tracking.stage_run(cfg, STAGE, out, upstream=upstream, params=params) as run:
        metrics, rows, edge = _quantize(cfg, tcfg, prepared, out, qat_profile)
        write_json(out / "edge.json", edge)
        frontier_csv = write_csv(Path(cfg.paths.reports) / "frontier.csv", rows, FRONTIER_COLUMNS)
        frontier_png(rows, edge, out / "frontier.png")
        final = swap_in(out, cfg.paths.tflite)
        # Logged from the final folder: a queued upload (server away) must find its file.
        run.log_metrics(metrics)
        run.set_tags({"tfmlops.edge_variant": edge["variant"]})
        run.log_artifact(frontier_csv, "reports")
        run.log_artifact(final / "frontier.png", "plots")
        run.log_artifact(final / "edge.json", "tflite")
        run.log_artifact(final / edge["file"], "tflite")
        if qat_profile is not None and profiling.trace_files(qat_profile):
            run.log_artifact(qat_profile, "profile")  # QAT fine-tune
    write_json(Path(cfg.paths.reports) / "quantize.json", metrics)
    log.info("quantize: %d variants; edge %s (%s bytes, accuracy %.4f vs Keras %.4f)", len(rows),
             edge["variant"], edge["bytes"], edge["accuracy"], edge["reference_accuracy"])
    return metrics


def _check(cfg: Config) -> Config:
    tcfg = source.trained(cfg)
    source.pruned_path(cfg)
    q = cfg.quantize
    available = source.train_split_size(cfg)
    if q.representative_samples > available:
        raise DataError(
            f"quantize.representative_samples: {q.representative_samples} is larger than the "
            f"train split ({available} images); set it to at most {available}"
        )
    return tcfg


def _quantize(cfg: Config, tcfg: Config, prepared, out: Path, qat_profile: Path | None):
    from tfmlops.compress import litert, tflite
    from tfmlops.data import pipeline, stored_split
    from tfmlops.runtimes import accuracy

    keras = source.tf_keras_module()
    keras.utils.set_random_seed(cfg.seed)
    q = cfg.quantize
    indices = tflite.sample_indices(prepared.counts["train"], q.representative_samples, cfg.seed)
    calibration = pipeline.rows_at(cfg, prepared, "train", indices)  # the sample alone read
    test = stored_split.StoredSplit.of(prepared)  # read in batches by each variant, not held
    y_test = test.labels()
    log.info("quantize: loading the trained and pruned models, Keras reference on %d images",
             len(y_test))
    original, trained_twin = source.load_trained(cfg, tcfg, prepared)
    reference = test.predict(lambda x: original.predict(x, verbose=0))  # batch 32: the peak
    reference_accuracy = accuracy(reference, y_test)
    models = {"pruned": source.load_pruned(cfg), "trained": trained_twin}

    failed: dict[str, str] = {}
    started = time.perf_counter()
    built = _convert_all(models, calibration, out, q, failed)
    if q.qat:
        log.info("quantize: [%d/%d] %s: QAT fine-tune (%d epoch(s)), then converting",
                 len(built) + len(failed) + 1, len(built) + len(failed) + 1, QAT_VARIANT,
                 q.qat_epochs)
    qat_report = _qat(cfg, tcfg, prepared, models["pruned"], calibration, out, failed, built,
                      qat_profile)
    convert_seconds = time.perf_counter() - started

    rows, details = [], {}
    for i, name in enumerate(built, 1):
        log.info("quantize: [%d/%d] evaluating %s on %d test images, timing %d runs",
                 i, len(built), name, len(y_test), q.latency_runs)
        try:
            row = litert.evaluate(out / f"{name}.tflite", test, y_test, reference, q.threads,
                                  q.latency_runs, q.latency_warmup)
        except (RuntimeError, ValueError) as exc:  # built, but LiteRT cannot run it
            failed[name] = f"LiteRT: {tflite.converter_message(exc)}"
            (out / f"{name}.tflite").unlink()
            continue
        details[name] = row
        rows.append({"variant": name, **{k: row[k] for k in FRONTIER_COLUMNS[1:]}})

    missing = [n for n in required_names(q.required) if n in failed]
    if missing:
        raise DataError(
            f"quantize.required: variant {missing[0]} failed ({failed[missing[0]]}); "
            "remove it from quantize.required or change the model"
        )
    if not rows:
        name, message = next(iter(failed.items()))
        raise DataError(f"quantize: no TFLite variant could be built ({name}: {message})")
    edge = select_edge(rows, reference_accuracy, q.accuracy_budget, q.edge_pick)
    metrics = _metrics(cfg, details, failed, reference_accuracy, edge, qat_report)
    metrics["convert_seconds"] = round(convert_seconds, 2)
    return metrics, rows, edge


def _convert_all(models: dict, calibration, out: Path, q, failed: dict) -> list[str]:
    """Every source x variant of `quantize.variants` converted into `out` (names of those
    built); one log line each."""
    from tfmlops.compress import tflite

    planned = [(src, variant) for src in SOURCES for variant in variants(src, q.variants)]
    total = len(planned) + (1 if q.qat else 0)  # QAT's variant comes after these
    built = []
    for k, (src, variant) in enumerate(planned, 1):
        name = f"{src}_{variant}"
        log.info("quantize: [%d/%d] converting %s", k, total, name)
        try:
            data = tflite.convert(models[src], variant, calibration)
        except Exception as exc:  # noqa: BLE001 - reported per variant, see `required`
            failed[name] = tflite.converter_message(exc)
            log.info("quantize: [%d/%d] %s not built: %s", k, total, name, failed[name])
            continue
        (out / f"{name}.tflite").write_bytes(data)
        built.append(name)
    return built


def _qat(cfg, tcfg, prepared, pruned, calibration, out: Path, failed: dict, built: list,
         profile_dir: Path | None):
    """Optional QAT INT8 of the pruned model; a failure is reported, not raised."""
    if not cfg.quantize.qat:
        return None
    from tfmlops.compress import qat, tflite
    from tfmlops.data import pipeline
    from tfmlops.model.optim import make_loss
    from tfmlops.progress import keras_verbose

    keras = source.tf_keras_module()
    report: dict = {"scheme": "Default8BitPrunePreserveQuantizeScheme"}
    try:
        model, left_float = qat.quantize_aware(pruned, keras)
        report["left_float"] = left_float
        train = pipeline.dataset(cfg, prepared, "train", batch_size=tcfg.train.batch_size,
                                 training=True)
        loss = make_loss(tcfg.train.loss, prepared.num_classes, keras)
        steps = math.ceil(prepared.counts["train"] / tcfg.train.batch_size)
        profile = profiling.keras_profile_batch(cfg, steps)
        callbacks = [keras.callbacks.TensorBoard(
            str(profile_dir), profile_batch=profile)] if profile and profile_dir else []
        report["fit"] = qat.fine_tune(model, train, cfg.quantize.qat_epochs,
                                      cfg.quantize.qat_learning_rate, loss, keras,
                                      keras_verbose(), callbacks)
        data = tflite.convert(model, INT8, calibration)
    except Exception as exc:  # noqa: BLE001 - an unsupported model is reported
        failed[QAT_VARIANT] = tflite.converter_message(exc)
        report["error"] = failed[QAT_VARIANT]
        return report
    (out / f"{QAT_VARIANT}.tflite").write_bytes(data)
    built.append(QAT_VARIANT)
    return report


def _metrics(cfg: Config, details: dict, failed: dict, reference_accuracy: float, edge: dict,
             qat_report) -> dict:
    """quantize.json: per-variant figures, the edge pick and the ratios the targets name."""

    def get(name, key):
        return details.get(name, {}).get(key)

    keras_gzip = gzip_bytes(trained_model_path(cfg))
    out = {
        "edge_variant": edge["variant"],
        "edge_within_budget": edge["within_budget"],
        "reference_accuracy": round(reference_accuracy, 6),
        "accuracy_budget": cfg.quantize.accuracy_budget,
        "variants": {
            name: {**d, "accuracy_delta": round(d["accuracy"] - reference_accuracy, 6)}
            for name, d in details.items()
        },
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
    out["trained_float32_gzip_vs_pruned_int8_gzip"] = ratio(
        get("trained_float32", "gzip_bytes"), get("pruned_int8", "gzip_bytes")
    )
    if qat_report is not None:
        out["qat"] = qat_report
    return out
