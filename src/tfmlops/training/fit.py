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
from dataclasses import dataclass
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.training.context import TrainContext

log = logging.getLogger(__name__)

# In paths.tuner: tune's timed decisions, per architecture (its trials and final round
# share them); tune copies the file to paths.tuned, where train reads the one it trained.
PRECISION_CACHE = "precision.json"
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


def built_model(merged: Config, prepared, keras, *, pretrained: bool = True):
    """The model of `merged.model` for this data, its backbone's weights loaded."""
    from tfmlops.model import backbones
    from tfmlops.model.builder import build_model

    model = build_model(merged.model, keras, prepared.input_shape, prepared.num_classes,
                        input_stats=(prepared.mean, prepared.std))
    if pretrained:
        backbones.load_pretrained(model, merged.model, keras)
    return model


def compile_model(model, merged: Config, prepared, keras, total_steps: int,
                  lr_factor: float = 1.0):
    """Compile with train's optimizer, schedule (peak x `lr_factor`) and loss; a fresh
    optimizer each call (a fine-tuning phase changes which variables it trains)."""
    from tfmlops.model.optim import make_loss, make_optimizer, make_schedule

    t = merged.train
    schedule = make_schedule(t.schedule, t.optimizer.learning_rate * lr_factor, total_steps, keras)
    model.compile(optimizer=make_optimizer(t.optimizer, schedule, keras),
                  loss=make_loss(t.loss, prepared.num_classes, keras),
                  metrics=["accuracy"],  # by keyword: the third positional is loss_weights
                  jit_compile=(JIT if keras.__version__[0] == "3" else JIT_TF_KERAS)[t.jit_compile])
    return model


def compiled_model(merged: Config, prepared, keras, total_steps: int, *, pretrained: bool = True):
    """Build and compile inside the strategy scope and dtype policy of the caller.

    `keras` is Keras 3 or tf_keras (multi-worker training): the same build and compile.
    One phase, everything trainable: `fit_in_phases` freezes and recompiles.
    """
    model = built_model(merged, prepared, keras, pretrained=pretrained)
    return compile_model(model, merged, prepared, keras, total_steps)


@dataclass(frozen=True)
class Phase:
    """One fit of a run: epochs [first, last), which backbone layers train, its lr."""

    number: int
    first: int
    last: int
    unfreeze: int | float | None  # top backbone layers trainable; None: all (no fine-tuning)
    lr_factor: float = 1.0


def phases(merged: Config, epochs: int | None = None) -> list[Phase]:
    """The fits of a run of `epochs` (default train.epochs).

    Two-phase fine-tuning needs a backbone with pretrained weights: a random backbone
    has nothing to keep (and its default BN statistics in inference mode make its
    features vanish), so it trains in one phase, fully trainable.
    """
    epochs = merged.train.epochs if epochs is None else epochs
    ft, m = merged.train.fine_tune, merged.model
    if m.backbone == "none" or m.backbone_weights is None or not ft.enabled:
        return [Phase(1, 0, epochs, None)]
    head = min(ft.head_epochs, epochs)
    out = [Phase(1, 0, head, 0)] if head else []
    if epochs > head:
        out.append(Phase(2, head, epochs, ft.unfreeze, ft.lr_factor))
    return out


def fit_in_phases(model, merged: Config, prepared, keras, steps_per_epoch: int, fit_one,
                  plan: list[Phase], done: int = 0):
    """Run `plan`: per phase, set what trains, recompile, `fit_one(phase)`. Phases a
    resumed run has finished (`done` epochs) are skipped. Returns the last fit's result."""
    from tfmlops.model import backbones

    result = None
    for phase in plan:
        if phase.last <= done:
            continue
        if merged.model.backbone != "none":
            trainable = backbones.set_trainable_top(model, phase.unfreeze)
            if len(plan) > 1:
                log.info(f"train: phase {phase.number}, epochs {phase.first + 1}-{phase.last}: "
                         f"{trainable} backbone layers trainable, learning rate x{phase.lr_factor:g}")
        compile_model(model, merged, prepared, keras, steps_per_epoch * (phase.last - phase.first),
                      phase.lr_factor)
        result = fit_one(phase)
    if merged.model.backbone != "none":
        backbones.set_trainable_top(model, None)  # saved whole: later stages train it all
    return result


def decide_precision(merged: Config, prepared, batch_size: int, *, timed: bool = True,
                     cache_file: str | Path | None = None, write: bool = True, flags=None):
    """`merged.train.precision` resolved for this model and batch (model/precision.py):
    `auto` from the hardware and the architecture; `timed`, on a CPU with bf16 units,
    times float32 against mixed_bfloat16 on a few steps of this very model, once per
    architecture. One log line when decided now. Seeds are consumed by a timing: set
    them after this call. `cache_file`: the timed decisions to reuse (`write`: add this
    one to it). `flags`: the CPU's (default: read from /proc/cpuinfo)."""
    import keras

    from tfmlops.model import precision

    flags = precision.cpu_flags() if flags is None else frozenset(flags)
    key = precision.cache_key(merged.model, prepared.input_shape, batch_size, flags)

    def measure() -> dict[str, float]:
        # One replica at the per-replica batch: what the bf16 units change is per device.
        train_ds = pipeline_train(merged, prepared, batch_size)
        steps = math.ceil(prepared.counts["train"] / batch_size)
        return precision.time_policies(
            lambda: compiled_model(merged, prepared, keras, steps * merged.train.epochs,
                                   pretrained=False),  # timing: the weights' values do not matter
            next(iter(train_ds)), keras)

    decision, now = precision.decide_cached(merged.train.precision, key, flags,
                                            measure if timed else None, cache_file, write,
                                            spec=merged.model,
                                            margin=merged.train.precision_margin)
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
    """Build (in the strategy's scope), then fit in phases; returns (model, recorder, seconds)."""
    import keras

    from tfmlops.model import callbacks as cb
    from tfmlops.progress import keras_verbose

    merged, prepared, folders = ctx.merged, ctx.prepared, ctx.folders
    train_ds, val_ds, steps_per_epoch = datasets(merged, prepared, ctx.global_batch)
    plan = phases(merged)
    with ctx.strategy.scope():
        model = built_model(merged, prepared, keras)
        # compiled once here for the checks below; each phase recompiles in the scope
        compile_model(model, merged, prepared, keras, steps_per_epoch * merged.train.epochs)
    scaled = loss_scaling(model, ctx.policy, keras)
    ctx.run.log_params({"resolved": {"jit_compile": bool(model.jit_compile),
                                     "loss_scaling": scaled, "fine_tune_phases": len(plan)}})

    recorder = cb.EpochRecorder(folders.backup, prepared.counts["train"], ctx.run, ctx.rows)

    def fit_one(phase: Phase):
        recorder.phase = phase.number if len(plan) > 1 else None
        callbacks = cb.training_callbacks(
            backup_dir=folders.backup, profile_dir=folders.profile,
            profile_batch=profiling.keras_profile_batch(ctx.cfg, steps_per_epoch),
            recorder=recorder,
            early_stopping_patience=merged.train.early_stopping_patience,
            reduce_lr_on_plateau=merged.train.reduce_lr_on_plateau,
            best_so_far=best_val_loss(recorder.rows),
        )
        return model.fit(train_ds, validation_data=val_ds, epochs=phase.last,
                         initial_epoch=phase.first, callbacks=callbacks,
                         verbose=keras_verbose() if tracking.is_chief() else 0,
                         shuffle=False)  # the dataset shuffles itself (seeded)

    started = time.perf_counter()
    with ctx.strategy.scope():  # each phase compiles: its optimizer's variables in the scope
        fit_in_phases(model, merged, prepared, keras, steps_per_epoch, fit_one, plan, ctx.done)
    return model, recorder, time.perf_counter() - started
