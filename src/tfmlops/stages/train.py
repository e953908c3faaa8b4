"""Stage `train`: the final model, under a tf.distribute strategy, tracked in MLflow.

Reads the prepared TFRecords and (with `train.use_tuned`) tune's
`best_hparams.yaml`, merged as params <- tuned <- train.overrides. Writes
`paths.train/` (model.keras, resolved_params.yaml, tune_merge.json, precision.json,
classification_report.json, confusion_matrix.png, training_curves.png,
mlflow_run.json), `reports/train.json` and `reports/train_history.csv`.

Order of work, and why:
1. bad input fails before TensorFlow does anything (missing or stale tune output, ImageNet
   weights neither in Keras' cache nor downloadable,
   missing or stale prepared data, a spec that cannot build, a batch larger
   than the data);
2. devices and the strategy come before any other TensorFlow op (logical CPUs
   and MultiWorkerMirroredStrategy cannot be set up later in a process);
3. the model is saved to `paths.train` before anything that may fail after it
   (plots, MLflow); the backup of a killed run is resumed, and emptied after a
   successful one.
Under multi-worker training every worker runs the same code (saving and
evaluating involve collective ops); only the chief's outputs are kept.

The work itself is in training/ (fit, evaluation, reports; multi-worker fit).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.model import backbones, hparams
from tfmlops.model.artifacts import MODEL_FILE
from tfmlops.training.context import TrainContext

log = logging.getLogger(__name__)


def run(cfg: Config) -> dict:
    started = time.perf_counter()
    tuned = None
    if cfg.train.use_tuned:
        tuned = hparams.read_best(cfg)
        hparams.check_fresh(cfg, tracking.data_version(cfg))  # a stale search is refused
    merged, changes = hparams.merge(cfg, tuned)
    backbones.ensure_weights(merged.model)  # ImageNet weights: in Keras' cache, or fetched now
    # The run's process starts now: it imports MLflow while this one imports TensorFlow.
    tracking.start_sidecar(cfg)
    try:
        return _run_started(cfg, merged, changes, started)
    except BaseException:  # before its run took the sidecar over: it is closed, not left
        tracking.discard_sidecar()
        raise


def _run_started(cfg: Config, merged: Config, changes, started: float) -> dict:
    from tfmlops.data import pipeline  # imports TensorFlow (no op runs yet)
    from tfmlops.model import strategy as dist
    from tfmlops.model.builder import check_buildable
    from tfmlops.training.fit import checked_global_batch, op_determinism

    prepared = pipeline.load_prepared(merged)
    check_buildable(merged.model, prepared.input_shape)
    kind = dist.resolve_strategy(merged.train.strategy, os.environ.get("TF_CONFIG"),
                                 dist.visible_gpus())
    if kind == "multi_worker" and dist.cluster_tasks(os.environ.get("TF_CONFIG")) > 1:
        # Keras 3 fit breaks across workers (see check_supported): the same strategy
        # runs tf_keras fit there, and the chief saves the same Keras 3 outputs.
        from tfmlops.training import multi_worker

        return multi_worker.train_multi_worker(cfg, merged, changes, prepared, started)
    dist.check_supported(kind, os.environ.get("TF_CONFIG"))
    dist.prepare_devices(kind, merged.train.replicas)  # before any other TensorFlow op
    strategy = dist.make_strategy(kind, merged.train.replicas)
    placement = dist.strategy_placement(strategy, kind)
    ctx = TrainContext(cfg, merged, changes, prepared, strategy, placement,
                       checked_global_batch(merged, placement, prepared),
                       chief=tracking.is_chief(), started=started)
    scratch = [] if ctx.chief else [Path(tempfile.mkdtemp(prefix="tfmlops-train-worker-"))]
    try:
        with op_determinism(merged.pipeline.deterministic):
            return _train(ctx, scratch)
    finally:
        for folder in scratch:  # a non-chief worker's checkpoints and outputs
            shutil.rmtree(folder, ignore_errors=True)


def _train(ctx: TrainContext, scratch: list[Path]) -> dict:
    import keras

    from tfmlops.model import callbacks as cb
    from tfmlops.model import precision
    from tfmlops.training import fit, reports
    from tfmlops.training.context import worker_folders

    cfg, merged = ctx.cfg, ctx.merged
    # Before the seed: timing the policies (`timed`) builds models (it draws random numbers).
    # The timed decision tune's final round trained this architecture with is reused (read
    # only: paths.tuned is tune's output), so train reproduces the round's curve.
    decision = fit.decide_precision(merged, ctx.prepared, merged.train.batch_size,
                                    cache_file=Path(cfg.paths.tuned) / fit.PRECISION_CACHE,
                                    write=False)
    ctx.policy, ctx.precision = decision.policy, decision
    keras.utils.set_random_seed(merged.seed)
    ctx.folders = worker_folders(cfg, merged, ctx.chief, scratch)
    ctx.done = cb.finished_epochs(ctx.folders.backup)
    ctx.rows = [r for r in cb.history_rows(ctx.folders.backup) if r["epoch"] <= ctx.done]
    if ctx.done:
        log.info(f"train: resuming after epoch {ctx.done} of {merged.train.epochs} from the "
                 f"backup in {cfg.paths.backup}")

    with reports.open_run(ctx):
        fit.log_precision(ctx.run, decision)
        with precision.global_policy(ctx.policy, keras):
            model, recorder, fit_seconds = fit.fit(ctx)
            best = ctx.folders.backup / cb.BEST_WEIGHTS
            if best.is_file():  # the final model is the epoch with the lowest val_loss
                model.load_weights(best)
            # Every worker saves (it may involve collective ops); only the chief's copy is kept.
            evaluation = reports.evaluate_and_save(ctx, model)
        if not ctx.chief:
            return {}
        metrics, final = reports.finish(ctx, model, evaluation, recorder.rows, fit_seconds)
    log.info(f"train: test accuracy {metrics['test_accuracy']:.4f} after {metrics['epochs_run']} "
             f"epochs ({metrics['wall_seconds']:.0f} s, {metrics['images_per_s']:.0f} images/s) -> "
             f"{final / MODEL_FILE}")
    return metrics
