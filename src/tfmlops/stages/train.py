"""Stage `train`: the final model, under a tf.distribute strategy, tracked in MLflow.

Reads the prepared TFRecords and (with `train.use_tuned`) tune's
`best_hparams.yaml`, merged as params <- tuned <- train.overrides. Writes
`paths.train/` (model.keras, resolved_params.yaml, tune_merge.json,
classification_report.json, confusion_matrix.png, training_curves.png,
mlflow_run.json), `reports/train.json` and `reports/train_history.csv`.

Order of work, and why:
1. bad input fails before TensorFlow does anything (missing tune output,
   missing or stale prepared data, a spec that cannot build, a batch larger
   than the data);
2. devices and the strategy come before any other TensorFlow op (logical CPUs
   and MultiWorkerMirroredStrategy cannot be set up later in a process);
3. the model is saved to `paths.train` before anything that may fail after it
   (plots, MLflow); the backup of a killed run is resumed, and emptied after a
   successful one.
Under multi-worker training every worker runs the same code (saving and
evaluating involve collective ops); only the chief's outputs are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import staging_dir, swap_in, write_csv, write_json
from tfmlops.model import hparams
from tfmlops.model.artifacts import MODEL_FILE, write_resolved

STAGE = "train"
JIT = {"auto": "auto", "true": True, "false": False}
# tf_keras (multi-worker path) takes a bool or None (its own default) for `auto`.
JIT_TF_KERAS = {"auto": None, "true": True, "false": False}


def run(cfg: Config) -> dict:
    started = time.perf_counter()
    tuned = hparams.read_best(cfg) if cfg.train.use_tuned else None
    merged, changes = hparams.merge(cfg, tuned)

    from tfmlops.data import pipeline  # imports TensorFlow (no op runs yet)
    from tfmlops.model import strategy as dist
    from tfmlops.model.builder import check_buildable

    prepared = pipeline.load_prepared(merged)
    check_buildable(merged.model, prepared.input_shape)
    kind = dist.resolve_strategy(merged.train.strategy, os.environ.get("TF_CONFIG"),
                                 dist.visible_gpus())
    if kind == "multi_worker" and dist.cluster_tasks(os.environ.get("TF_CONFIG")) > 1:
        # Keras 3 fit breaks across workers (see check_supported): the same strategy
        # runs tf_keras fit there, and the chief saves the same Keras 3 outputs.
        from tfmlops.model import multi_worker

        return multi_worker.run(cfg, merged, changes, prepared, started)
    dist.check_supported(kind, os.environ.get("TF_CONFIG"))
    dist.prepare_devices(kind, merged.train.replicas)  # before any other TensorFlow op
    strategy = dist.make_strategy(kind, merged.train.replicas)
    placement = dist.describe(strategy, kind)
    global_batch = checked_global_batch(merged, placement, prepared)

    chief = tracking.is_chief()
    scratch = [] if chief else [Path(tempfile.mkdtemp(prefix="tfmlops-train-worker-"))]
    try:
        with op_determinism(merged.pipeline.deterministic):
            return _train(cfg, merged, changes, prepared, strategy, placement, global_batch,
                          chief, scratch, started)
    finally:
        for folder in scratch:  # a non-chief worker's checkpoints and outputs
            shutil.rmtree(folder, ignore_errors=True)


def checked_global_batch(merged: Config, placement: dict, prepared) -> int:
    """Per-replica batch x replicas; fails clearly when it exceeds the train split."""
    global_batch = merged.train.batch_size * placement["replicas"]
    if global_batch > prepared.counts["train"]:
        raise DataError(
            f"train.batch_size {merged.train.batch_size} x {placement['replicas']} replica(s) = "
            f"{global_batch} is more than the {prepared.counts['train']} train images; lower "
            "train.batch_size (or train.overrides / tune's batch_size)"
        )
    return global_batch


def _train(cfg, merged, changes, prepared, strategy, placement, global_batch, chief, scratch,
           started) -> dict:
    import keras

    from tfmlops.model import callbacks as cb
    from tfmlops.model import precision

    keras.utils.set_random_seed(merged.seed)
    policy = precision.resolve_precision(merged.train.precision, precision.gpu_capabilities())
    out_dir, backup_dir, profile_dir = _folders(cfg, merged, chief, scratch)
    done = cb.finished_epochs(backup_dir)
    rows = [r for r in cb.history_rows(backup_dir) if r["epoch"] <= done]
    if done:
        print(f"train: resuming after epoch {done} of {merged.train.epochs} from the backup in "
              f"{cfg.paths.backup}")

    upstream = {"prepare": cfg.paths.prepared, "tune": cfg.paths.tuned}
    with tracking.stage_run(cfg, STAGE, out_dir, upstream=upstream, params=_params(merged)) as run:
        _log_setup(run, merged, changes, placement, global_batch, policy, done)
        for row in rows:  # the killed run's epochs, so this run holds the whole curve
            run.log_metrics(cb.metrics_of(row), step=row["epoch"])
        with precision.global_policy(policy, keras):
            model, recorder, fit_seconds = _fit(cfg, merged, prepared, strategy, policy,
                                                global_batch, backup_dir, profile_dir, run, rows)
            best = backup_dir / cb.BEST_WEIGHTS
            if best.is_file():  # the final model is the epoch with the lowest val_loss
                model.load_weights(best)
            test, x_test, y_test, predicted = evaluate_test(model, merged, prepared, global_batch)
            # Every worker saves (it may involve collective ops); only the chief's copy is kept.
            model.save(out_dir / MODEL_FILE)
        write_resolved(merged, out_dir)
        write_json(out_dir / "tune_merge.json", changes)
        if not chief:
            return {}
        # The model is now in paths.train: nothing after this line can lose it.
        final = swap_in(out_dir, cfg.paths.train)

        report = classification_report(y_test, predicted, prepared.classes)
        write_json(final / "classification_report.json", report)
        metrics = _metrics(recorder.rows, test, report, placement, global_batch, done,
                           wall_seconds=time.perf_counter() - started, fit_seconds=fit_seconds,
                           profile=profiling.trace_summary(profile_dir))
        reports = Path(cfg.paths.reports)
        write_csv(reports / "train_history.csv", recorder.rows, cb.HISTORY_COLUMNS)
        write_json(reports / "train.json", metrics)
        cb.clear(backup_dir)
        _plot(final, recorder.rows, report, prepared.classes)
        _log_results(run, model, metrics, final, reports, profile_dir, x_test[:2])
    print(f"train: test accuracy {metrics['test_accuracy']:.4f} after {metrics['epochs_run']} "
          f"epochs ({metrics['wall_seconds']:.0f} s, {metrics['images_per_s']:.0f} images/s) -> "
          f"{final / MODEL_FILE}")
    return metrics


def _folders(cfg: Config, merged: Config, chief: bool, scratch: list[Path]):
    """(outputs, backup, traces) of this worker; the chief's are the real ones.

    A backup made with other params or data is discarded; a non-chief worker
    resumes from a copy of the chief's backup (a shared filesystem is assumed).
    """
    from tfmlops.model import callbacks as cb

    # pipeline.autotune changes speed, not batches: a backup made either way resumes
    same = dataclasses.replace(merged, pipeline=dataclasses.replace(merged.pipeline,
                                                                    autotune=False))
    fingerprint = {"params": same.digest("seed", "data", "pipeline", "model", "train"),
                   "data": tracking.data_version(merged)}
    if chief:
        backup_dir = Path(cfg.paths.backup)
        had_backup = cb.finished_epochs(backup_dir) > 0
        if not cb.adopt_backup(backup_dir, fingerprint) and had_backup:
            print(f"train: discarded the backup in {backup_dir}: made with other params or data")
        return staging_dir(cfg.paths.train), backup_dir, profiling.fresh_profile_dir(cfg, STAGE)
    out_dir, backup_dir, profile_dir = (scratch[0] / name for name in ("out", "backup", "tb"))
    out_dir.mkdir(parents=True)
    cb.copy_backup(cfg.paths.backup, backup_dir, fingerprint)
    return out_dir, backup_dir, profile_dir


def _fit(cfg, merged, prepared, strategy, policy, global_batch, backup_dir, profile_dir, run,
         rows):
    """Build, compile (in the strategy's scope) and fit; returns (model, recorder, seconds)."""
    import keras

    from tfmlops.model import callbacks as cb
    from tfmlops.model import precision
    from tfmlops.progress import keras_verbose

    train_ds, val_ds, steps_per_epoch = datasets(merged, prepared, global_batch)
    with strategy.scope():
        model = compiled_model(merged, prepared, keras, steps_per_epoch * merged.train.epochs)
    scaled = precision.uses_loss_scaling(model, keras)
    if policy == "mixed_float16" and not scaled:
        raise RuntimeError("mixed_float16 without a LossScaleOptimizer: float16 gradients "
                           "would underflow")
    run.log_params({"resolved": {"jit_compile": bool(model.jit_compile), "loss_scaling": scaled}})

    recorder = cb.EpochRecorder(backup_dir, prepared.counts["train"], run, rows)
    val_losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    callbacks = cb.training_callbacks(
        backup_dir=backup_dir, profile_dir=profile_dir,
        profile_batch=profiling.keras_profile_batch(cfg, steps_per_epoch),
        recorder=recorder,
        early_stopping_patience=merged.train.early_stopping_patience,
        reduce_lr_on_plateau=merged.train.reduce_lr_on_plateau,
        best_so_far=min(val_losses) if val_losses else None,
    )
    started = time.perf_counter()
    model.fit(train_ds, validation_data=val_ds, epochs=merged.train.epochs, callbacks=callbacks,
              verbose=keras_verbose() if tracking.is_chief() else 0,
              shuffle=False)  # the dataset shuffles itself (seeded)
    return model, recorder, time.perf_counter() - started


def _log_results(run, model, metrics, final: Path, reports: Path, profile_dir: Path,
                 input_example) -> None:
    # `images_per_s` is also the per-epoch series: the summary gets its own name.
    run.log_metrics({("steady_images_per_s" if k == "images_per_s" else k): v
                     for k, v in metrics.items()})
    for name in ("resolved_params.yaml", "tune_merge.json", "classification_report.json",
                 "confusion_matrix.png", "training_curves.png"):
        run.log_artifact(final / name, "train")
    run.log_artifact(reports / "train_history.csv", "reports")
    run.log_artifact(reports / "train.json", "reports")
    if profiling.trace_files(profile_dir):
        run.log_artifact(profile_dir, "profile")
    run.log_keras_model(model, final / MODEL_FILE, input_example=input_example)


@contextlib.contextmanager
def op_determinism(enabled: bool):
    """TensorFlow op determinism for the run (with the seed: bit-identical runs on CPU).

    Restored afterwards, so a test session that calls `run` in-process keeps its state.
    """
    from tensorflow.python.framework import config as tf_config

    before = tf_config.is_op_determinism_enabled()
    if enabled and not before:
        tf_config.enable_op_determinism()
    try:
        yield
    finally:
        if enabled and not before:
            tf_config.disable_op_determinism()


def evaluate_test(model, merged: Config, prepared, global_batch: int):
    """(Keras metrics on the test split, its images, labels and predicted classes)."""
    import tensorflow as tf

    from tfmlops.data import pipeline

    steps = math.ceil(prepared.counts["test"] / global_batch)  # known: Keras does not warn
    test_ds = pipeline.dataset(merged, prepared, "test", batch_size=global_batch)
    test = model.evaluate(test_ds.apply(tf.data.experimental.assert_cardinality(steps)),
                          verbose=0, return_dict=True)
    x_test, y_test = pipeline.arrays(merged, prepared, "test")
    predicted = model.predict(x_test, batch_size=global_batch, verbose=0).argmax(-1)
    return test, x_test, y_test, predicted


def datasets(merged: Config, prepared, global_batch: int):
    """(train, val, steps per epoch): the batches train fits on, in its order."""
    import tensorflow as tf

    from tfmlops.data import pipeline

    steps_per_epoch = math.ceil(prepared.counts["train"] / global_batch)
    # Known lengths: Keras shows real progress and does not warn at the end of epoch 1.
    cardinality = tf.data.experimental.assert_cardinality
    train_ds = pipeline.dataset(merged, prepared, "train", batch_size=global_batch,
                                training=True).apply(cardinality(steps_per_epoch))
    val_ds = pipeline.dataset(merged, prepared, "val", batch_size=global_batch).apply(
        cardinality(math.ceil(prepared.counts["val"] / global_batch)))
    return train_ds, val_ds, steps_per_epoch


def compiled_model(merged: Config, prepared, keras, total_steps: int):
    """Build and compile inside the strategy scope and dtype policy of the caller.

    `keras` is Keras 3 or tf_keras (multi-worker training): the same build and compile.
    """
    from tfmlops.model.builder import build_model
    from tfmlops.model.optim import make_loss, make_optimizer, make_schedule

    t = merged.train
    model = build_model(merged.model, keras, prepared.input_shape, prepared.num_classes)
    schedule = make_schedule(t.schedule, t.optimizer.learning_rate, total_steps, keras)
    model.compile(optimizer=make_optimizer(t.optimizer, schedule, keras),
                  loss=make_loss(t.loss, prepared.num_classes, keras),
                  metrics=["accuracy"],  # by keyword: the third positional is loss_weights
                  jit_compile=(JIT if keras.__version__[0] == "3" else JIT_TF_KERAS)[t.jit_compile])
    return model


def _params(merged: Config) -> dict:
    d = merged.to_dict()
    return {"seed": d["seed"], "model": d["model"], "train": d["train"],
            "pipeline": d["pipeline"]}


def _log_setup(run, merged, changes, placement, global_batch, policy, done) -> None:
    run.log_params({
        "resolved": {
            "precision_policy": policy,
            "strategy": placement["strategy"],
            "strategy_class": placement["strategy_class"],
            "replicas": placement["replicas"],
            "workers": placement["workers"],
            "per_replica_batch_size": merged.train.batch_size,
            "global_batch_size": global_batch,
            "jit_compile_requested": merged.train.jit_compile,
        },
        # The tune merge as params: key -> "params.yaml value -> used value (source)".
        "tune_merge": {c["key"]: f"{c['params']} -> {c['used']} ({c['source']})"
                       for c in changes},
    })
    run.log_dict(changes, "train/tune_merge.json")
    run.set_tags({"tfmlops.precision": policy, "tfmlops.strategy": placement["strategy"],
                  "tfmlops.trained_params_hash": merged.digest(),
                  "tfmlops.resumed_after_epoch": done})
    run.log_dataset("prepared", str(Path(merged.paths.prepared).resolve()),
                    tracking.data_version(merged), context="training")


def _metrics(rows, test, report, placement, global_batch, done, *, wall_seconds,
             fit_seconds, profile) -> dict:
    # Steady state: the first epoch of a process also traces and compiles.
    fresh = [r["images_per_s"] for r in rows if r["epoch"] > done]
    steady = fresh[1:] or fresh
    best = min(rows, key=lambda r: r["val_loss"]) if rows else {}
    return {
        "test_accuracy": float(test["accuracy"]),
        "test_loss": float(test["loss"]),
        "test_macro_f1": report["macro"]["f1"],
        "epochs_run": len(rows),
        "best_epoch": best.get("epoch", 0),
        "best_val_loss": best.get("val_loss"),
        "best_val_accuracy": best.get("val_accuracy"),
        "resumed_after_epoch": done,
        "wall_seconds": round(wall_seconds, 2),
        "fit_seconds": round(fit_seconds, 2),
        "images_per_s": round(statistics.median(steady), 1) if steady else 0.0,
        "replicas": placement["replicas"],
        "global_batch_size": global_batch,
        **{k: round(v, 6) for k, v in profile.items()},
    }


def classification_report(y_true, y_pred, classes: list[str]) -> dict:
    """Confusion matrix (rows: true class) and per-class precision, recall and F1."""
    import numpy as np

    n = len(classes)
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (np.asarray(y_true, np.int64), np.asarray(y_pred, np.int64)), 1)
    per_class = {}
    for i, name in enumerate(classes):
        tp = int(matrix[i, i])
        precision = tp / max(int(matrix[:, i].sum()), 1)
        recall = tp / max(int(matrix[i].sum()), 1)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = {"precision": round(precision, 6), "recall": round(recall, 6),
                           "f1": round(f1, 6), "support": int(matrix[i].sum())}
    macro = {k: round(float(np.mean([c[k] for c in per_class.values()])), 6)
             for k in ("precision", "recall", "f1")}
    return {"classes": classes, "confusion_matrix": matrix.tolist(), "per_class": per_class,
            "macro": macro, "accuracy": float(np.trace(matrix) / max(matrix.sum(), 1))}


def _plot(folder: Path, rows: list[dict], report: dict, classes: list[str]) -> None:
    """confusion_matrix.png and training_curves.png, each written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    matrix = report["confusion_matrix"]
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(len(classes)), yticks=range(len(classes)), xticklabels=classes,
           yticklabels=classes, xlabel="predicted", ylabel="true",
           title=f"test accuracy {report['accuracy']:.4f}")
    for i, line in enumerate(matrix):
        for j, count in enumerate(line):
            if count:
                ax.text(j, i, str(count), ha="center", va="center", fontsize=7)
    _save_figure(fig, folder / "confusion_matrix.png")

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [r["epoch"] for r in rows]
    for key, ax in (("loss", loss_ax), ("accuracy", acc_ax)):
        ax.plot(epochs, [r[key] for r in rows], label=f"train {key}")
        ax.plot(epochs, [r[f"val_{key}"] for r in rows], label=f"val {key}")
        ax.set(xlabel="epoch", title=key)
        ax.legend()
    _save_figure(fig, folder / "training_curves.png")
    plt.close("all")


def _save_figure(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)

