"""Stage `prune`: tfmot magnitude pruning of the trained model, then fine-tuning.

Runs with TF_USE_LEGACY_KERAS=1 (set by the CLI): tfmot works only on
tf_keras. The trained Keras 3 model is rebuilt in tf_keras with the shared
builder, every prunable layer is wrapped with a PolynomialDecay schedule
(begin/end steps from prune.epochs x steps per epoch x the fractions), and
the model is fine-tuned through the project's input pipeline with
UpdatePruningStep and PruningSummaries (TensorBoard, into the profile folder,
with a profiler trace of a few steps when profiling.enabled). Of the epochs
that end at full sparsity, the one with the lowest val_loss is kept.

Outputs: `paths.pruned/model.keras` (stripped, tf_keras format) and
`mlflow_run.json`, built in a staging folder and swapped in whole;
`reports/prune.json` (sparsity, accuracy against the trained model, gzip
sizes) and `reports/prune_sparsity.csv` (one row per weighted layer).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from tfmlops import harness
from tfmlops.artifacts import MODEL_FILE, report_path
from tfmlops.compress import source
from tfmlops.compress.measure import SPARSITY_COLUMNS, gzip_bytes, sparsity_table
from tfmlops.config import Config
from tfmlops.files import write_csv
from tfmlops.model.trained import trained_config
from tfmlops.stages import StageSpec
from tfmlops.stages.prune import pruning

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="prune",
    help="tensorflow-model-optimization magnitude pruning and fine-tuning",
    output="pruned",
    upstream=("prepare", "train"),
    params=("prune",),
    reports=("prune.json", "prune_sparsity.csv"),
    keras="tf_keras",
    sidecar=True,
)
BN_CALIBRATION_IMAGES = 4096  # train images that re-estimate BatchNorm statistics


def run(cfg: Config) -> dict:
    tcfg = trained_config(cfg)  # DataError (exit 2) before TensorFlow loads
    steps = pruning.pruning_steps(cfg.prune, source.train_split_size(cfg), tcfg.train.batch_size)
    params = {"prune": cfg.to_dict()["prune"], "model": tcfg.to_dict()["model"],
              "schedule_steps": asdict(steps)}
    # The run is kept by the sidecar, which imports MLflow while this process imports
    # TensorFlow (in the block): tracking adds no import of its own to the stage's time.
    with harness.stage(cfg, SPEC, params=params) as st:
        from tfmlops.data import pipeline

        prepared = pipeline.load_prepared(cfg)
        metrics, rows = _prune(cfg, tcfg, prepared, steps, st)
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


def _prune(cfg: Config, tcfg: Config, prepared, steps, st) -> tuple[dict, list]:
    from tfmlops import profiling
    from tfmlops.data import pipeline
    from tfmlops.model.custom import make_loss
    from tfmlops.progress import keras_verbose
    from tfmlops.runtimes import accuracy

    keras = source.tf_keras_module()
    keras.utils.set_random_seed(cfg.seed)
    log.info("prune: [1/3] loading the trained model into tf_keras, its test accuracy")
    original, twin = source.load_trained(cfg, tcfg, prepared)
    y_test, outputs = pipeline.predicted(original, cfg, prepared, "test", 256)
    trained_accuracy = accuracy(outputs, y_test)
    # The same tf_keras format as the pruned file, saved before fine-tuning
    # (the pruning wrappers share these layers' weights).
    with tempfile.TemporaryDirectory() as tmp:
        unpruned = Path(tmp) / MODEL_FILE
        twin.save(unpruned)
        unpruned_bytes, unpruned_gzip = unpruned.stat().st_size, gzip_bytes(unpruned)

    wrapped, left_dense = pruning.prunable_clone(
        twin, pruning.polynomial_decay(cfg.prune, steps), keras
    )
    wrapped.compile(optimizer=keras.optimizers.Adam(cfg.prune.learning_rate),
                    loss=make_loss(tcfg.train.loss, prepared.num_classes, keras),
                    metrics=["accuracy"])
    out, run, log_dir = st.out, st.run, st.profile_dir()
    callbacks = pruning.callbacks(str(log_dir),
                                  profiling.keras_profile_batch(cfg, steps.steps_per_epoch))
    train = pipeline.dataset(cfg, prepared, "train", batch_size=tcfg.train.batch_size,
                             training=True)
    val = pipeline.dataset(cfg, prepared, "val", batch_size=tcfg.train.batch_size)
    keep = pruning.keep_best_pruned(keras, steps.end_step, steps.steps_per_epoch)
    log.info("prune: [2/3] fine-tuning under the pruning schedule: %d epoch(s) to sparsity %s",
             cfg.prune.epochs, cfg.prune.final_sparsity)
    started = time.perf_counter()
    history = wrapped.fit(train, validation_data=val, epochs=cfg.prune.epochs,
                          callbacks=[*callbacks, keep], verbose=keras_verbose())
    fine_tune_seconds = time.perf_counter() - started
    kept_epoch = keep.restore()
    for epoch in range(cfg.prune.epochs):
        run.log_metrics({f"fine_tune_{k}": v[epoch] for k, v in history.history.items()},
                        step=epoch)
    pruned_names = pruning.pruned_weight_names(wrapped)

    log.info("prune: [3/3] stripping the wrappers, recalibrating batch norm, measuring")
    stripped = pruning.strip(wrapped)
    first = range(min(BN_CALIBRATION_IMAGES, prepared.counts["train"]))  # not the whole split
    stripped = pruning.recalibrated_batch_norm(
        stripped, pipeline.rows_at(cfg, prepared, "train", first), keras)
    stripped.save(out / MODEL_FILE)
    rows, overall = sparsity_table(pruning.layer_weights(stripped, pruned_names))
    pruned_accuracy = accuracy(pipeline.predicted(stripped, cfg, prepared, "test", 256)[1],
                               y_test)
    pruned_gzip = gzip_bytes(out / MODEL_FILE)

    metrics = {
        **overall,
        "target_sparsity": cfg.prune.final_sparsity,
        "test_accuracy": round(pruned_accuracy, 6),
        "trained_test_accuracy": round(trained_accuracy, 6),
        "accuracy_delta": round(pruned_accuracy - trained_accuracy, 6),
        "bytes_pruned": (out / MODEL_FILE).stat().st_size,
        "bytes_unpruned": unpruned_bytes,
        "gzip_bytes_pruned": pruned_gzip,
        "gzip_bytes_unpruned": unpruned_gzip,
        "gzip_ratio": round(unpruned_gzip / pruned_gzip, 3),
        "prunable_layers": sum(r["prunable"] for r in rows),
        "left_dense": left_dense,
        "schedule": asdict(steps),
        "fine_tune_seconds": round(fine_tune_seconds, 2),
        "kept_epoch": kept_epoch,  # the full-sparsity epoch with the lowest val_loss
    }
    return metrics, rows
