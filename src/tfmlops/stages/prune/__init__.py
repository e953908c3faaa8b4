"""Stage `prune`: tfmot magnitude pruning of the trained model, then fine-tuning.

Runs with TF_USE_LEGACY_KERAS=1 (set by the CLI): tfmot works only on tf_keras. The trained
Keras 3 model is rebuilt in tf_keras with the shared builder, every prunable layer is wrapped
with a PolynomialDecay schedule (begin/end steps from prune.epochs x steps per epoch x the
fractions), and the model is fine-tuned through the project's input pipeline with
UpdatePruningStep and PruningSummaries (TensorBoard, into the profile folder, with a profiler
trace of a few steps when profiling.enabled). Of the epochs that end at full sparsity, the one
with the lowest val_loss is kept.

Outputs: `paths.pruned/model.keras` (stripped, tf_keras format) and `mlflow_run.json`, built
in a staging folder and swapped in whole; `reports/prune.json` (sparsity, accuracy against the
trained model, gzip sizes) and `reports/prune_sparsity.csv` (one row per weighted layer).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

from tfmlops import harness
from tfmlops.artifacts import MODEL_FILE, report_path
from tfmlops.files import write_csv
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="prune",
    help="tensorflow-model-optimization magnitude pruning and fine-tuning",
    output="pruned",
    upstream=("prepare", "train"),
    params=("prune",),
    reports=("prune.json", "prune_sparsity.csv"),
    headline=("test_accuracy", "accuracy_delta", "sparsity", "gzip_bytes_pruned", "gzip_ratio"),
    keras="tf_keras",
    sidecar=True,
)


def run(cfg: Config) -> dict:
    from tfmlops.compress import source
    from tfmlops.compress.measure import SPARSITY_COLUMNS
    from tfmlops.model.trained import trained_config
    from tfmlops.stages.prune import pruning

    tcfg = trained_config(cfg)  # DataError (exit 2) before TensorFlow loads
    steps = pruning.pruning_steps(cfg.prune, source.train_split_size(cfg), tcfg.train.batch_size)
    params = {"prune": cfg.to_dict()["prune"], "model": tcfg.to_dict()["model"],
              "schedule_steps": asdict(steps)}
    # The run is kept by the sidecar, which imports MLflow while this process imports
    # TensorFlow (in the block): tracking adds no import of its own to the stage's time.
    with harness.stage(cfg, SPEC, params=params) as st:
        from tfmlops.data import pipeline
        from tfmlops.stages.prune import fine_tune

        prepared = pipeline.load_prepared(cfg)
        metrics, rows = fine_tune.prune_and_fine_tune(cfg, tcfg, prepared, steps, st)
        sparsity_csv = write_csv(report_path(cfg.paths.reports, SPEC.name, "_sparsity.csv"), rows,
                                 SPARSITY_COLUMNS)
        final = st.swap()  # logged from the final folder: a queued upload must find its file
        st.report(metrics)
        st.run.log_artifact(sparsity_csv, "reports")
        st.run.log_artifact(final / MODEL_FILE, "model")
    log.info("prune: sparsity %.3f (target %s), test accuracy %.4f (trained %.4f), "
             "gzip %.2fx smaller", metrics["sparsity"], cfg.prune.final_sparsity,
             metrics["test_accuracy"], metrics["trained_test_accuracy"], metrics["gzip_ratio"])
    return metrics
