"""Stage `quantize`: TFLite variants of the pruned and the trained model, one frontier.

Runs with TF_USE_LEGACY_KERAS=1 (set by the CLI). For each source (the pruned model, and the
unpruned trained model for comparison) it builds float32, dynamic-range, float16 and full-
integer INT8 (int8 in and out, calibrated on `quantize.representative_samples` train images
drawn through the input pipeline), and of the pruned model also INT8 in TFLite's sparse
encoding; with `quantize.qat`, also a pruning-preserving QAT INT8 model. A variant the
converter refuses is reported with the converter's message; only the variants in
`quantize.required` (of the pruned model) fail the stage.

Every variant runs in LiteRT on the whole test split (read in batches): accuracy, top-1
agreement with the Keras reference (the trained model's predictions), bytes raw and gzipped,
batch-1 latency p50/p95 (same image, `quantize.threads`). The edge variant is the smallest
(`quantize.edge_pick: fastest`: the lowest p50) within `quantize.accuracy_budget` of the
reference.

Outputs: `paths.tflite/<source>_<variant>.tflite`, `edge.json`, `frontier.png`,
`mlflow_run.json` (staged, swapped in whole); `reports/quantize.json`, `reports/frontier.csv`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tfmlops import harness
from tfmlops.artifacts import EDGE, FRONTIER_PNG, TAG_EDGE_VARIANT, report_path
from tfmlops.errors import DataError
from tfmlops.files import write_csv, write_json
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="quantize",
    help="TFLite variants (float32, dynamic, float16, INT8, optional QAT)",
    output="tflite",
    upstream=("prepare", "train", "prune"),
    params=("quantize",),
    reports=("quantize.json", "frontier.csv"),
    # the edge file's own figures are export's tflite.*; here, the INT8 variants beside it
    headline=("edge_variant", "edge_within_budget", "reference_accuracy",
              "variants.trained_int8.accuracy", "variants.trained_int8.bytes",
              "variants.trained_int8.p50_ms", "variants.pruned_int8_sparse.accuracy",
              "variants.pruned_int8_sparse.bytes", "keras_gzip_vs_pruned_int8_gzip"),
    keras="tf_keras",
    sidecar=True,
)


def run(cfg: Config) -> dict:
    from tfmlops.stages.quantize.frontier import FRONTIER_COLUMNS

    tcfg = _check(cfg)  # bad input fails here, before TensorFlow loads
    params = {"quantize": cfg.to_dict()["quantize"], "model": tcfg.to_dict()["model"]}
    # The sidecar keeps the run: it imports MLflow while this process imports TensorFlow.
    with harness.stage(cfg, SPEC, params=params) as st:
        from tfmlops.data import pipeline
        from tfmlops.stages.quantize import variants
        from tfmlops.stages.quantize.plot import frontier_png

        prepared = pipeline.load_prepared(cfg)
        # QAT's fine-tune is the one part worth a trace; its folder is this run's.
        qat_profile = st.profile_dir() if cfg.quantize.qat and cfg.profiling.enabled else None
        metrics, rows, edge = variants.build_and_evaluate(cfg, tcfg, prepared, st.out,
                                                          qat_profile)
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
    from tfmlops.compress import source
    from tfmlops.model.trained import trained_config

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
