"""The batches, the compiled model, op determinism and `fit` (one machine, Keras 3).

`datasets` and `compiled_model` are shared by the single-worker fit, the
multi-worker fit (tf_keras) and tune's final round, so all three train the
same batches with the same build and compile.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.training.context import TrainContext

log = logging.getLogger(__name__)

PRECISION_CACHE = "precision.json"  # in paths.tuner: tune's decisions, per architecture
JIT = {"auto": "auto", "true": True, "false": False}
# tf_keras (multi-worker path) takes a bool or None (its own default) for `auto`.
JIT_TF_KERAS = {"auto": None, "true": True, "false": False}


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


def decide_precision(merged: Config, prepared, batch_size: int, *, timed: bool = True,
                     cache_file: str | Path | None = None, flags=None):
    """`merged.train.precision` resolved for this model and batch (model/precision.py):
    on a CPU with bf16 units, `auto` times float32 against mixed_bfloat16 on a few
    steps of this very model, once per architecture. One log line when decided now.
    Seeds are consumed by the timing: set them after this call. `flags`: the CPU's
    (default: read from /proc/cpuinfo)."""
    import keras

    from tfmlops.model import precision

    flags = precision.cpu_flags() if flags is None else frozenset(flags)
    key = precision.cache_key(merged.model, prepared.input_shape, batch_size, flags)

    def measure() -> dict[str, float]:
        # One replica at the per-replica batch: what the bf16 units change is per device.
        train_ds = pipeline_train(merged, prepared, batch_size)
        steps = math.ceil(prepared.counts["train"] / batch_size)
        return precision.time_policies(
            lambda: compiled_model(merged, prepared, keras, steps * merged.train.epochs),
            next(iter(train_ds)), keras)

    decision, now = precision.decide_cached(merged.train.precision, key, flags,
                                            measure if timed else None, cache_file)
    if now:
        log.info(decision.line(merged.train.precision))
    return decision


def pipeline_train(merged: Config, prepared, batch_size: int):
    from tfmlops.data import pipeline

    return pipeline.dataset(merged, prepared, "train", batch_size=batch_size, training=True)


def log_precision(run, decision) -> None:
    """The decision into a run: params `resolved.precision_*`, metrics of each timing."""
    params, metrics = decision.mlflow()
    run.log_params({"resolved": params})
    if metrics:
        run.log_metrics(metrics)


def loss_scaling(model, policy: str, keras) -> bool:
    """Whether the optimizer scales the loss; mixed_float16 without it is refused."""
    from tfmlops.model import precision

    scaled = precision.uses_loss_scaling(model, keras)
    if policy == "mixed_float16" and not scaled:
        raise RuntimeError("mixed_float16 without a LossScaleOptimizer: float16 gradients "
                           "would underflow")
    return scaled


def best_val_loss(rows: list[dict]) -> float | None:
    """The lowest val_loss of the resumed epochs (the checkpoint's threshold)."""
    val_losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return min(val_losses) if val_losses else None


def fit(ctx: TrainContext):
    """Build, compile (in the strategy's scope) and fit; returns (model, recorder, seconds)."""
    import keras

    from tfmlops.model import callbacks as cb
    from tfmlops.progress import keras_verbose

    merged, prepared, folders = ctx.merged, ctx.prepared, ctx.folders
    train_ds, val_ds, steps_per_epoch = datasets(merged, prepared, ctx.global_batch)
    with ctx.strategy.scope():
        model = compiled_model(merged, prepared, keras, steps_per_epoch * merged.train.epochs)
    scaled = loss_scaling(model, ctx.policy, keras)
    ctx.run.log_params({"resolved": {"jit_compile": bool(model.jit_compile),
                                     "loss_scaling": scaled}})

    recorder = cb.EpochRecorder(folders.backup, prepared.counts["train"], ctx.run, ctx.rows)
    callbacks = cb.training_callbacks(
        backup_dir=folders.backup, profile_dir=folders.profile,
        profile_batch=profiling.keras_profile_batch(ctx.cfg, steps_per_epoch),
        recorder=recorder,
        early_stopping_patience=merged.train.early_stopping_patience,
        reduce_lr_on_plateau=merged.train.reduce_lr_on_plateau,
        best_so_far=best_val_loss(ctx.rows),
    )
    started = time.perf_counter()
    model.fit(train_ds, validation_data=val_ds, epochs=merged.train.epochs, callbacks=callbacks,
              verbose=keras_verbose() if tracking.is_chief() else 0,
              shuffle=False)  # the dataset shuffles itself (seeded)
    return model, recorder, time.perf_counter() - started
