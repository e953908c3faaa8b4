"""Stage `quantize`: TFLite variants of the pruned and the trained model, one frontier.

Runs with TF_USE_LEGACY_KERAS=1 (set by the CLI). For each source (the pruned model, and the
unpruned trained model for comparison) it builds float32, dynamic-range, float16 and full-
integer INT8 (int8 in and out, calibrated on `quantize.representative_samples` train images
drawn through the input pipeline), and of the pruned model also INT8 in TFLite's sparse
encoding; with `quantize.qat`, also a pruning-preserving QAT INT8 model. A variant the
converter refuses is reported with the converter's message; only the variants in
`quantize.required` (of the pruned model) fail the stage.

Every variant runs in LiteRT on the whole test split (read in batches): accuracy, top-1
agreement with the Keras reference (the trained model's predictions), bytes raw and
gzipped, batch-1 latency p50/p95 (same image, `quantize.threads`).
The edge variant is the smallest (`quantize.edge_pick: fastest`: the lowest p50) within
`quantize.accuracy_budget` of the reference.

Outputs: `paths.tflite/<source>_<variant>.tflite`, `edge.json`, `frontier.png`,
`mlflow_run.json` (staged, swapped in whole); `reports/quantize.json`, `reports/frontier.csv`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tfmlops import harness
from tfmlops.artifacts import EDGE, FRONTIER_PNG, TAG_EDGE_VARIANT, report_path
from tfmlops.compress import source
from tfmlops.config import Config
from tfmlops.config.sections.quantize import QAT_VARIANT
from tfmlops.errors import DataError
from tfmlops.files import write_csv, write_json
from tfmlops.model.trained import trained_config
from tfmlops.stages import StageSpec
from tfmlops.stages.quantize.frontier import FRONTIER_COLUMNS, required_names, select_edge

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="quantize",
    help="TFLite variants (float32, dynamic, float16, INT8, optional QAT)",
    output="tflite",
    upstream=("prepare", "train", "prune"),
    params=("quantize",),
    reports=("quantize.json", "frontier.csv"),
    keras="tf_keras",
    sidecar=True,
)


def run(cfg: Config) -> dict:
    tcfg = _check(cfg)  # bad input fails here, before TensorFlow loads
    params = {"quantize": cfg.to_dict()["quantize"], "model": tcfg.to_dict()["model"]}
    # The sidecar keeps the run: it imports MLflow while this process imports TensorFlow.
    with harness.stage(cfg, SPEC, params=params) as st:
        from tfmlops.data import pipeline
        from tfmlops.stages.quantize.plot import frontier_png

        prepared = pipeline.load_prepared(cfg)
        # QAT's fine-tune is the one part worth a trace; its folder is this run's.
        qat_profile = st.profile_dir() if cfg.quantize.qat and cfg.profiling.enabled else None
        metrics, rows, edge = _quantize(cfg, tcfg, prepared, st.out, qat_profile)
        write_json(st.out / EDGE, edge)
        frontier_csv = write_csv(report_path(cfg.paths.reports, "frontier", ".csv"), rows,
                                 FRONTIER_COLUMNS)
        frontier_png(rows, edge, st.out / FRONTIER_PNG)
        final = st.swap()  # logged from the final folder: a queued upload must find its file
        st.report(metrics)
        st.run.set_tags({TAG_EDGE_VARIANT: edge["variant"]})
        st.run.log_artifact(frontier_csv, "reports")
        st.run.log_artifact(final / FRONTIER_PNG, "plots")
        st.run.log_artifact(final / EDGE, "tflite")
        st.run.log_artifact(final / edge["file"], "tflite")
    log.info("quantize: %d variants; edge %s (%s bytes, accuracy %.4f vs Keras %.4f)", len(rows),
             edge["variant"], edge["bytes"], edge["accuracy"], edge["reference_accuracy"])
    return metrics


def _check(cfg: Config) -> Config:
    tcfg = trained_config(cfg)
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
    from tfmlops.data import pipeline, stored_split
    from tfmlops.runtimes import accuracy
    from tfmlops.stages.quantize import conversion, litert, tflite

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
    built = conversion.convert_all(models, calibration, out, q, failed)
    if q.qat:
        log.info("quantize: [%d/%d] %s: QAT fine-tune (%d epoch(s)), then converting",
                 len(built) + len(failed) + 1, len(built) + len(failed) + 1, QAT_VARIANT,
                 q.qat_epochs)
    qat_report = conversion.qat_variant(cfg, tcfg, prepared, models["pruned"], calibration, out,
                                        failed, built, qat_profile)
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
    metrics = conversion.quantize_metrics(cfg, details, failed, reference_accuracy, edge,
                                          qat_report)
    metrics["convert_seconds"] = round(convert_seconds, 2)
    return metrics, rows, edge
