"""What `quantize` builds and measures: every TFLite variant of the pruned and the trained
model (conversion.py), each run in LiteRT on the test split (litert.py), the frontier and
its edge variant (frontier.py). Imported inside the stage's `run`: TensorFlow and tfmot
load only when the stage runs."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tfmlops.compress import source
from tfmlops.config import Config
from tfmlops.config.sections.quantize import QAT_VARIANT
from tfmlops.data import pipeline, stored_split
from tfmlops.errors import DataError
from tfmlops.runtimes import accuracy
from tfmlops.stages.quantize import conversion, litert, tflite
from tfmlops.stages.quantize.frontier import FRONTIER_COLUMNS, required_names, select_edge

log = logging.getLogger(__name__)


def build_and_evaluate(cfg: Config, tcfg: Config, prepared, out: Path,
                       qat_profile: Path | None) -> tuple[dict, list, dict]:
    """Every variant built, run in LiteRT on the test split and timed; the edge chosen.
    Returns (metrics, frontier rows, the edge variant)."""
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
