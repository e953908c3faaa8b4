"""The `train` stage across several workers: tf_keras `fit` under MultiWorkerMirroredStrategy.

Why tf_keras: Keras 3's `fit` fails under a MultiWorkerMirroredStrategy that
spans more than one worker (keras-team/keras#20585, open; seen here with
Keras 3.15.1 and TF 2.21: "PerReplica ... to a Tensor"). tf_keras 2.21's
`fit` runs the same strategy (TensorFlow's own, nothing home-made) and is
importable beside Keras 3 without TF_USE_LEGACY_KERAS. The architecture comes
from the shared builder, so after training the chief rebuilds it in Keras 3,
copies the weights and saves `paths.train/model.keras` exactly as the
single-worker path does: every later stage is unchanged.

What differs from the single-worker path (training/fit.py), and why:
- every worker passes the same `paths.backup` to tf_keras' BackupAndRestore
  and ModelCheckpoint; the chief writes there (`chief/` TF checkpoints,
  `best.weights.h5`), each other worker writes to its own
  `workertemp_<task>` folder and deletes it (tf_keras' multi-worker
  semantics: saving involves collective ops, so all workers save). A restart
  resumes every worker from the chief's checkpoint: `paths.backup` must be on
  a filesystem every worker sees (one machine, NFS, or a bucket path);
- the per-epoch history goes to `paths.backup/history.json` on the chief and
  to a private temp folder (deleted at the end) elsewhere;
- after `fit` no collective op is left: non-chief workers stop there, the
  chief evaluates, predicts and saves with the Keras 3 twin;
- `train.optimizer.name: lamb` is refused (tf_keras has no Lamb) and
  `train.jit_compile: auto` means tf_keras' default (no XLA).
The reports, plots, metrics and MLflow logging are training/reports.py's, as on one worker.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.errors import ConfigError
from tfmlops.files import staging_dir, write_json
from tfmlops.model.artifacts import MODEL_FILE
from tfmlops.training import reports
from tfmlops.training.context import STAGE, Folders, TrainContext
from tfmlops.training.fit import (
    best_val_loss,
    checked_global_batch,
    compiled_model,
    datasets,
    decide_precision,
    log_precision,
    loss_scaling,
    op_determinism,
    phases,
)

log = logging.getLogger(__name__)

CHIEF_CHECKPOINTS = "chief"  # tf_keras' BackupAndRestore keeps the chief's state here
EPOCH_KEY = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"  # 0-based index of the last epoch
BACKUP_FORMAT = "tf_keras-multi-worker"  # in the fingerprint: never resumed by the Keras 3 path
TF_KERAS_OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")


def train_multi_worker(cfg: Config, merged: Config, changes: list, prepared, started: float) -> dict:
    """Train on every worker of TF_CONFIG; the chief writes what the single-worker path writes."""
    tracking.preflight(cfg)  # the chief's store is away: fail now, before any worker waits
    if merged.train.optimizer.name not in TF_KERAS_OPTIMIZERS:
        raise ConfigError(
            f"train.optimizer.name: {merged.train.optimizer.name} is not available in tf_keras, "
            f"which multi-worker training uses; use one of {', '.join(TF_KERAS_OPTIMIZERS)}"
        )
    import tensorflow as tf

    from tfmlops.model import strategy as dist

    # Before any other TensorFlow op: collective ops are configured at startup.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    placement = dist.strategy_placement(strategy, "multi_worker")
    ctx = TrainContext(cfg, merged, changes, prepared, strategy, placement,
                       checked_global_batch(merged, placement, prepared),
                       chief=tracking.is_chief(), started=started)
    scratch = None if ctx.chief else Path(tempfile.mkdtemp(prefix="tfmlops-train-worker-"))
    try:
        with op_determinism(merged.pipeline.deterministic):
            return _train(ctx, scratch)
    finally:
        if scratch is not None:  # a non-chief worker's history, outputs and traces
            shutil.rmtree(scratch, ignore_errors=True)


def chief_finished_epochs(backup_dir: str | Path) -> int:
    """Epochs the chief's tf_keras backup in `backup_dir` has finished (0: nothing to resume)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(Path(backup_dir) / CHIEF_CHECKPOINTS))
    if not latest:
        return 0
    try:
        return int(tf.train.load_checkpoint(latest).get_tensor(EPOCH_KEY)) + 1
    except (tf.errors.OpError, ValueError):
        return 0


def _folders(ctx: TrainContext, scratch: Path | None) -> Folders:
    """Every worker passes paths.backup to tf_keras (it redirects non-chief writes);
    history, outputs and traces of a non-chief worker go to its scratch folder."""
    backup_dir = Path(ctx.cfg.paths.backup)
    if scratch is None:
        _adopt_backup(backup_dir, ctx.merged)
        return Folders(staging_dir(ctx.cfg.paths.train), backup_dir,
                       profiling.fresh_profile_dir(ctx.cfg, STAGE), backup_dir)
    out_dir, history_dir, profile_dir = (scratch / n for n in ("out", "history", "tb"))
    out_dir.mkdir(parents=True)
    history_dir.mkdir()
    return Folders(out_dir, backup_dir, profile_dir, history_dir)


def _train(ctx: TrainContext, scratch: Path | None) -> dict:
    import keras
    import tf_keras

    from tfmlops.model import callbacks as cb
    from tfmlops.model import precision

    merged, placement = ctx.merged, ctx.placement
    tf_keras.utils.set_random_seed(merged.seed)
    # Not timed: each worker would time on its own and could pick another policy than
    # the others; `timed` is float32 here (`auto` is decided from the hardware alone).
    decision = decide_precision(merged, ctx.prepared, merged.train.batch_size, timed=False)
    ctx.policy, ctx.precision = decision.policy, decision
    ctx.folders = _folders(ctx, scratch)
    ctx.done = chief_finished_epochs(ctx.folders.backup)
    ctx.rows = _resumed_rows(ctx.folders.history, ctx.done)
    resolver = ctx.strategy.cluster_resolver
    task = f"{resolver.task_type}:{resolver.task_id}"
    if ctx.done and scratch is None:
        log.info(f"train: resuming after epoch {ctx.done} of {merged.train.epochs} from the "
                 f"backup in {ctx.cfg.paths.backup}")

    with reports.open_run(ctx):
        log_precision(ctx.run, decision)
        with precision.global_policy(ctx.policy, tf_keras):
            model, recorder, fit_seconds = _fit(ctx, task)
            # Reading SyncOnRead variables (BatchNorm statistics) all-reduces: every worker.
            weights = model.get_weights()
        if scratch is not None:  # no collective op is left: the chief finishes alone
            return {"task": task, "epochs_run_now": len(recorder.rows)}

        with precision.global_policy(ctx.policy, keras):
            model = _keras3_twin(weights, merged, ctx.prepared, ctx.folders.backup / cb.BEST_WEIGHTS,
                                 math.ceil(ctx.prepared.counts["train"] / ctx.global_batch))
        evaluation = reports.evaluate_and_save(ctx, model)
        metrics, final = reports.finish(ctx, model, evaluation, recorder.rows, fit_seconds)
    log.info(f"train: test accuracy {metrics['test_accuracy']:.4f} after {metrics['epochs_run']} "
             f"epochs on {placement['workers']} workers ({metrics['wall_seconds']:.0f} s, "
             f"{metrics['images_per_s']:.0f} images/s) -> {final / MODEL_FILE}")
    return metrics


def _adopt_backup(backup_dir: Path, merged: Config) -> None:
    """Keep a tf_keras backup made with the same params and data; wipe any other (chief only)."""
    from tfmlops.model import callbacks as cb

    fingerprint = {"params": merged.digest("seed", "data", "pipeline", "model", "train"),
                   "data": tracking.data_version(merged), "format": BACKUP_FORMAT}
    had_backup = chief_finished_epochs(backup_dir) > 0
    if had_backup and cb.matches(backup_dir, fingerprint):
        return
    if had_backup:
        log.info(f"train: discarded the backup in {backup_dir}: made with other params or data")
    cb.clear(backup_dir)
    write_json(backup_dir / cb.FINGERPRINT_FILE, fingerprint)


def _fit(ctx: TrainContext, task: str):
    """Build and compile with tf_keras in the strategy's scope, then fit; (model, recorder, s)."""
    import tf_keras

    from tfmlops.progress import keras_verbose

    merged, prepared, folders = ctx.merged, ctx.prepared, ctx.folders
    # the same batches, build and compile as single-machine train, in tf_keras
    train_ds, val_ds, steps_per_epoch = datasets(merged, prepared, ctx.global_batch)
    shard_policy = _shard_policy(train_ds)
    log.info(f"train: {task} of {_cluster_tasks()} workers, {ctx.strategy.num_replicas_in_sync} "
             f"replicas, global batch {ctx.global_batch}, auto-shard {shard_policy}")

    if len(phases(merged)) > 1:  # not built for tf_keras fit across workers
        log.warning("train: train.fine_tune is ignored across workers: one phase, the whole "
                    "backbone trainable")
    with ctx.strategy.scope():
        model = compiled_model(merged, prepared, tf_keras, steps_per_epoch * merged.train.epochs)
    scaled = loss_scaling(model, ctx.policy, tf_keras)
    ctx.run.log_params({"resolved": {"jit_compile": bool(model.jit_compile),
                                     "loss_scaling": scaled, "auto_shard_policy": shard_policy}})

    recorder = _tf_keras_recorder(folders.history, prepared.counts["train"], ctx.run, ctx.rows)
    callbacks = _callbacks(merged, folders.backup, folders.profile, recorder,
                           profiling.keras_profile_batch(ctx.cfg, steps_per_epoch),
                           best_val_loss(_resumed_rows(folders.backup, ctx.done)))
    started = time.perf_counter()
    model.fit(train_ds, validation_data=val_ds, epochs=merged.train.epochs,
              callbacks=callbacks, verbose=keras_verbose() if tracking.is_chief() else 0,
              shuffle=False)  # the dataset shuffles itself (seeded)
    return model, recorder.inner, time.perf_counter() - started


def _resumed_rows(history_dir: Path, done: int) -> list[dict]:
    """The rows of the epochs the backup finished, from `history_dir`.

    A worker's recorder continues its own history (a scratch folder on a non-chief);
    the checkpoint's threshold comes from the shared backup's, the same on every
    worker: a worker that saves the best weights when the chief does not waits in a
    collective the chief never joins (shape mismatch, both fail).
    """
    from tfmlops.model import callbacks as cb

    return [r for r in cb.history_rows(history_dir) if r["epoch"] <= done]


def _callbacks(merged, backup_dir: Path, profile_dir: Path, recorder, profile_batch,
               best_so_far) -> list:
    """The single-worker callback list and order, in tf_keras (see model/callbacks.py)."""
    import tf_keras

    from tfmlops.model import callbacks as cb

    c = tf_keras.callbacks
    t = merged.train
    cbs = [recorder, c.ModelCheckpoint(str(backup_dir / cb.BEST_WEIGHTS), monitor=cb.MONITOR,
                                       mode="min", save_best_only=True, save_weights_only=True,
                                       initial_value_threshold=best_so_far)]
    if t.early_stopping_patience:
        cbs.append(c.EarlyStopping(monitor=cb.MONITOR, mode="min",
                                   patience=t.early_stopping_patience))
    if t.reduce_lr_on_plateau:
        cbs.append(c.ReduceLROnPlateau(monitor=cb.MONITOR, mode="min", factor=0.5, patience=2,
                                       min_lr=1e-6))
    cbs.append(c.TensorBoard(log_dir=str(profile_dir), profile_batch=profile_batch,
                             write_graph=False))
    # Kept after a successful fit: the chief empties the folder once the model is saved.
    cbs.append(c.BackupAndRestore(str(backup_dir), delete_checkpoint=False))
    return cbs


def _tf_keras_recorder(history_dir, train_images, run, rows):
    """model/callbacks.EpochRecorder behind tf_keras' callback interface (`.inner` is it).

    tf_keras calls hooks a Keras 3 callback lacks, and a MirroredVariable
    learning rate does not convert through `keras.ops`: forward the hooks the
    recorder uses and read the rate with tf_keras' backend.
    """
    import tf_keras

    from tfmlops.model import callbacks as cb
    from tfmlops.model.precision import inner_optimizer

    class Recorder(cb.EpochRecorder):
        def learning_rate(self) -> float:
            optimizer = inner_optimizer(self.model.optimizer)
            return float(tf_keras.backend.get_value(optimizer.learning_rate))

    class Forward(tf_keras.callbacks.Callback):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def set_model(self, model):
            super().set_model(model)
            self.inner.set_model(model)

        def on_epoch_begin(self, epoch, logs=None):
            self.inner.on_epoch_begin(epoch, logs)

        def on_test_begin(self, logs=None):
            self.inner.on_test_begin(logs)

        def on_epoch_end(self, epoch, logs=None):
            self.inner.on_epoch_end(epoch, logs)

    return Forward(Recorder(history_dir, train_images, run, rows))


def _keras3_twin(weights: list, merged: Config, prepared, best_weights: Path,
                 steps_per_epoch: int):
    """The trained tf_keras weights as a compiled Keras 3 model (the best epoch's weights).

    The weights pass through a tf_keras model outside the strategy, so loading
    `best.weights.h5` (tf_keras' h5 layout) touches no distributed variable. The Keras 3 optimizer is
    fresh (its state does not carry over; later stages never resume training).
    """
    import keras
    import tf_keras

    from tfmlops.model.builder import build_model

    local = build_model(merged.model, tf_keras, prepared.input_shape, prepared.num_classes,
                        input_stats=(prepared.mean, prepared.std))
    local.set_weights(weights)
    if best_weights.is_file():  # the final model is the epoch with the lowest val_loss
        local.load_weights(best_weights)
    twin = compiled_model(merged, prepared, keras, steps_per_epoch * merged.train.epochs,
                          pretrained=False)  # it receives the trained weights
    twin.set_weights(local.get_weights())
    # Built (zero slots), so loading the saved file finds the optimizer variables it expects.
    twin.optimizer.build(twin.trainable_variables)
    return twin


def _shard_policy(ds) -> str:
    """The auto-shard policy the fed dataset carries; refuse any but an explicit one."""
    policy = ds.options().experimental_distribute.auto_shard_policy
    if policy.name not in ("DATA", "FILE"):
        raise RuntimeError(f"the train dataset's auto-shard policy is {policy.name}; "
                           "data/pipeline.dataset must set DATA or FILE explicitly")
    return policy.name


def _cluster_tasks() -> int:
    from tfmlops.model.strategy import cluster_tasks

    return cluster_tasks(os.environ.get("TF_CONFIG"))
