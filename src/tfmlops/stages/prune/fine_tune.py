"""What `prune` does to the trained model: wrapped with tfmot's pruning schedule,
fine-tuned through the project's input pipeline, stripped, BatchNorm re-estimated,
measured against the unpruned model. Imported inside the stage's `run`: TensorFlow and
tfmot load only when the stage runs."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from tfmlops import profiling
from tfmlops.artifacts import MODEL_FILE
from tfmlops.compress import source
from tfmlops.compress.measure import gzip_bytes, sparsity_table
from tfmlops.config import Config
from tfmlops.data import pipeline
from tfmlops.model.custom import make_loss
from tfmlops.progress import keras_verbose
from tfmlops.runtimes import accuracy
from tfmlops.stages.prune import pruning

log = logging.getLogger(__name__)

BN_CALIBRATION_IMAGES = 4096  # train images that re-estimate BatchNorm statistics


def prune_and_fine_tune(cfg: Config, tcfg: Config, prepared, steps, st) -> tuple[dict, list]:
    """The trained model pruned under the schedule `steps`, fine-tuned, stripped, its
    BatchNorm re-estimated and saved into `st.out`; returns (metrics, sparsity rows)."""
    keras = source.tf_keras_module()
    keras.utils.set_random_seed(cfg.seed)
    log.info("prune: [1/3] loading the trained model into tf_keras, its test accuracy")
    original, twin = source.load_trained(cfg, tcfg, prepared)
    y_test, outputs = pipeline.predicted(original, cfg, prepared, "test", 256)
    trained_accuracy = accuracy(outputs, y_test)
    recovered = validation_count(original, cfg, prepared) if cfg.prune.stop_when_recovered \
        else None
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
    keep = pruning.keep_best_pruned(keras, steps.end_step, steps.steps_per_epoch, recovered)
    log.info("prune: [2/3] fine-tuning under the pruning schedule: %d epoch(s) to sparsity %s%s",
             cfg.prune.epochs, cfg.prune.final_sparsity,
             f", ending once {recovered[0]} of {recovered[1]} validation images are right "
             "again (the trained model's)" if recovered else "")
    started = time.perf_counter()
    history = wrapped.fit(train, validation_data=val, epochs=cfg.prune.epochs,
                          callbacks=[*callbacks, keep], verbose=keras_verbose())
    fine_tune_seconds = time.perf_counter() - started
    kept_epoch = keep.restore()
    epochs_run = log_fine_tune(run, history.history, keep.stopped_at_epoch, cfg.prune.epochs)
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
        "fine_tune_epochs": epochs_run,
        "stopped_at_epoch": keep.stopped_at_epoch,  # recovered there (None: never recovered)
    }
    return metrics, rows


def validation_count(model, cfg: Config, prepared) -> tuple[int, int]:
    """(validation images `model` gets right, of how many): what a pruned model must get
    right again for `prune.stop_when_recovered` to end its fine-tuning."""
    labels, outputs = pipeline.predicted(model, cfg, prepared, "val", 256)
    return round(accuracy(outputs, labels) * len(labels)), len(labels)


def log_fine_tune(run, history: dict, stopped_at: int | None, planned: int) -> int:
    """Each fine-tuning epoch's metrics into the run (`fine_tune_<key>` at its step), the
    early end said in one line; returns the epochs run."""
    epochs_run = len(history["loss"])
    if stopped_at is not None and stopped_at < planned:
        log.info("prune: recovered after epoch %d of %d: the trained model's validation "
                 "accuracy at full sparsity; fine-tuning ends there", stopped_at, planned)
    for epoch in range(epochs_run):
        run.log_metrics({f"fine_tune_{k}": v[epoch] for k, v in history.items()}, step=epoch)
    return epochs_run
