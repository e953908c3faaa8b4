"""What every fit of the project does, tune's trials, its final round and `train` alike:
the batches, the built and compiled model, op determinism, precision, fine-tuning
phases, the callbacks that change what a run learns and the ones that define a fit's
files (history recorder, best checkpoint, backup). Functions that touch Keras take the
keras module (as model/builder.py does), so Keras 3 and tf_keras fits are this code.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from tfmlops import faults
from tfmlops.config import Config
from tfmlops.files import write_json

log = logging.getLogger(__name__)

JIT = {"true": True, "false": False}  # `auto`: Keras 3's "auto", tf_keras' None (its default)
MONITOR = "val_loss"  # smoother than val_accuracy on a small validation split
BEST_WEIGHTS = "best.weights.h5"
HISTORY_FILE = "history.json"
HISTORY_COLUMNS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate",
                   "epoch_seconds", "images_per_s", "phase")  # phase: fine-tuning runs only


def is_keras3(keras) -> bool:
    return keras.__version__[0] == "3"



@contextlib.contextmanager
def op_determinism(enabled: bool):
    """TensorFlow op determinism for the run (with the seed: bit-identical runs on CPU),
    restored afterwards: a test session that calls `run` in-process keeps its state."""
    from tensorflow.python.framework import config as tf_config

    switch = enabled and not tf_config.is_op_determinism_enabled()
    if switch:
        tf_config.enable_op_determinism()
    try:
        yield
    finally:
        if switch:
            tf_config.disable_op_determinism()


def steps(prepared, batch_size: int, split: str = "train") -> int:
    return math.ceil(prepared.counts[split] / batch_size)


def sized(merged: Config, prepared, split: str, batch_size: int, **kwargs):
    """A split's batches, of known length: Keras shows real progress and does not warn at
    the end of epoch 1 that the input ran out of data."""
    import tensorflow as tf

    from tfmlops.data import pipeline

    ds = pipeline.dataset(merged, prepared, split, batch_size=batch_size, **kwargs)
    return ds.apply(tf.data.experimental.assert_cardinality(steps(prepared, batch_size, split)))


def datasets(merged: Config, prepared, global_batch: int):
    """(train, val, steps per epoch): the batches train fits on, in its order."""
    return (sized(merged, prepared, "train", global_batch, training=True),
            sized(merged, prepared, "val", global_batch), steps(prepared, global_batch))


def built_model(merged: Config, prepared, keras, *, pretrained: bool = True):
    """The model of `merged.model` for this data, its backbone's weights loaded."""
    from tfmlops.model import backbones
    from tfmlops.model.builder import build_model

    model = build_model(merged.model, keras, prepared.input_shape, prepared.num_classes,
                        input_stats=(prepared.mean, prepared.std))
    if pretrained:
        backbones.load_pretrained(model, merged.model, keras)
    return model


def compile_model(model, merged: Config, prepared, keras, total_steps: int, lr_factor: float = 1.0):
    """Compile with train's optimizer, schedule (peak x `lr_factor`) and loss; a fresh
    optimizer each call (a fine-tuning phase changes which variables it trains)."""
    from tfmlops.model.custom import make_loss, make_optimizer, make_schedule

    t = merged.train
    schedule = make_schedule(t.schedule, t.optimizer.learning_rate * lr_factor, total_steps, keras)
    model.compile(optimizer=make_optimizer(t.optimizer, schedule, keras),
                  loss=make_loss(t.loss, prepared.num_classes, keras),
                  metrics=["accuracy"],  # by keyword: the third positional is loss_weights
                  jit_compile=JIT.get(t.jit_compile, "auto" if is_keras3(keras) else None))
    return model


def compiled_model(merged: Config, prepared, keras, total_steps: int, *, pretrained: bool = True):
    """Build and compile inside the strategy scope and dtype policy of the caller: one
    phase, everything trainable (`fit_in_phases` freezes and recompiles)."""
    return compile_model(built_model(merged, prepared, keras, pretrained=pretrained), merged,
                         prepared, keras, total_steps)


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


def fit_in_phases(model, merged: Config, prepared, keras, data: tuple, plan: list[Phase],
                  callbacks, verbose: int, done: int = 0):
    """Run `plan` on `data` (train, val, steps per epoch: `datasets`): per phase, set what
    trains, recompile, fit with `callbacks(phase)`. Phases a resumed run has finished
    (`done` epochs) are skipped. Returns the last fit's History, its `history` holding the
    epochs of every phase run."""
    from tfmlops.model import backbones

    train_ds, val_ds, steps_per_epoch = data
    result, history = None, {}
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
        result = model.fit(train_ds, validation_data=val_ds, epochs=phase.last,
                           initial_epoch=phase.first, callbacks=callbacks(phase), verbose=verbose,
                           shuffle=False)  # the dataset shuffles itself (seeded)
        for key, values in result.history.items():
            history.setdefault(key, []).extend(values)
    if merged.model.backbone != "none":
        backbones.set_trainable_top(model, None)  # saved whole: later stages train it all
    if result is not None:
        result.history = history
    return result


def choose_precision(merged: Config, prepared, batch_size: int, *, timed: bool = True,
                     cache_file: str | Path | None = None, write: bool = True, flags=None):
    """`merged.train.precision` resolved for this model and batch (model/precision.py),
    logged when decided now. A timing consumes seeds: set them after this call.
    `cache_file`: the timed choices to reuse (`write`: add this one to it); `flags`:
    the CPU's (default: read from /proc/cpuinfo)."""
    import keras

    from tfmlops.model import precision

    flags = precision.cpu_flags() if flags is None else frozenset(flags)
    key = precision.cache_key(merged.model, prepared.input_shape, batch_size, flags)

    def measure() -> dict[str, float]:
        # One replica at the per-replica batch: what the bf16 units change is per device.
        return precision.time_policies(
            lambda: compiled_model(merged, prepared, keras,
                                   steps(prepared, batch_size) * merged.train.epochs,
                                   pretrained=False),  # timing: the weights' values do not matter
            next(iter(sized(merged, prepared, "train", batch_size, training=True))), keras)

    chosen, now = precision.choose_cached(
        merged.train.precision, key, flags, measure if timed else None, cache_file, write,
        spec=merged.model, margin=merged.train.precision_margin)
    if now:
        log.info(chosen.line(merged.train.precision))
    return chosen


def log_precision(run, chosen) -> None:
    """The precision choice into a run: params `resolved.precision_*`, metrics of each timing."""
    params, metrics = chosen.mlflow()
    run.log_params({"resolved": params})
    if metrics:
        run.log_metrics(metrics)


def best_val_loss(rows: list[dict]) -> float | None:
    """The lowest val_loss of the resumed epochs (the checkpoint's threshold)."""
    val_losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return min(val_losses) if val_losses else None



@dataclass(frozen=True)
class Folders:
    """Where this worker writes: the chief's are the real ones, other workers' are scratch."""

    backup: Path  # BackupAndRestore state and best.weights.h5
    profile: Path  # TensorBoard / profiler traces
    history: Path  # history.json of finished epochs (the backup, but on tf_keras workers)



# ------------------------------------------------------------- callbacks

@functools.cache
def recorder_class(keras):
    from tfmlops.model.precision import inner_optimizer

    class EpochRecorder(keras.callbacks.Callback):
        """One row per epoch (metrics, learning rate, epoch seconds, images/s), kept in the
        history folder (a resumed run keeps its earlier epochs) and logged to the run (a
        no-op off the chief) at step `epoch`, counted from 1 across fine-tuning's phases;
        such a run's rows carry their `phase` (1: backbone frozen, 2: top unfrozen)."""

        def __init__(self, history_dir, train_images: int, run, rows: list[dict]):
            super().__init__()
            self.history_file = Path(history_dir) / HISTORY_FILE
            self.train_images, self.run, self.rows = train_images, run, list(rows)
            self._started, self._epoch_start = False, 0.0
            self._train_seconds: float | None = None
            self.phase: int | None = None  # set by the fit of each fine-tuning phase
            self.fault_point = "train.epoch_end"  # tune's final round names its own

        def on_epoch_begin(self, epoch, logs=None):
            if not self._started:
                # Rows of epochs the restored state has not finished are dropped
                # (killed after writing the row but before the backup).
                self._started = True
                self.rows = [r for r in self.rows if r["epoch"] <= epoch]
            self._epoch_start = time.perf_counter()
            self._train_seconds = None

        def on_test_begin(self, logs=None):
            if self._train_seconds is None:  # validation starts: the epoch's training is over
                self._train_seconds = time.perf_counter() - self._epoch_start

        def on_epoch_end(self, epoch, logs=None):
            # A test holds train here (`train.epoch_end@2`: the first epoch's backup is written)
            faults.point(self.fault_point)
            logs = logs or {}
            epoch_seconds = time.perf_counter() - self._epoch_start
            train_seconds = self._train_seconds or epoch_seconds
            row = {"epoch": epoch + 1,
                   **{k: None if logs.get(k) is None else float(logs[k])
                      for k in HISTORY_COLUMNS[1:5]},
                   "learning_rate": self.learning_rate(),
                   "epoch_seconds": round(epoch_seconds, 4),
                   "images_per_s": round(self.train_images / max(train_seconds, 1e-9), 1)}
            if self.phase is not None:
                row["phase"] = self.phase
            self.rows.append(row)
            write_json(self.history_file, self.rows)
            self.run.log_metrics(metrics_of(row), step=row["epoch"])

        def learning_rate(self) -> float:
            rate = inner_optimizer(self.model.optimizer).learning_rate
            # a MirroredVariable (tf_keras, several workers) does not convert through keras.ops
            return float(keras.ops.convert_to_numpy(rate) if is_keras3(keras)
                         else keras.backend.get_value(rate))

    return EpochRecorder


def metrics_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "epoch" and v is not None}


def stopping_callbacks(t, keras) -> list:
    """The callbacks that change what a run learns (`t`: its train config; also used by
    tune's final round)."""
    cbs = []
    if t.early_stopping_patience:
        cbs.append(keras.callbacks.EarlyStopping(monitor=MONITOR, mode="min",
                                                 patience=t.early_stopping_patience))
    if t.reduce_lr_on_plateau:
        cbs.append(keras.callbacks.ReduceLROnPlateau(monitor=MONITOR, mode="min", factor=0.5,
                                                     patience=2, min_lr=1e-6))
    return cbs


def training_callbacks(keras, t, where: Folders, profile_batch, recorder,
                       best_so_far: float | None) -> list:
    """The callback list of a run (`t`: its train config), in the order the module
    docstring explains."""
    c = keras.callbacks
    cbs = [recorder, c.ModelCheckpoint(str(where.backup / BEST_WEIGHTS), monitor=MONITOR,
                                       mode="min", save_best_only=True, save_weights_only=True,
                                       initial_value_threshold=best_so_far)]
    cbs += stopping_callbacks(t, keras)
    cbs.append(c.TensorBoard(log_dir=str(where.profile), profile_batch=profile_batch,
                             write_graph=False))
    # Kept after a successful fit: the chief empties the folder once the model is saved.
    # double_checkpoint (Keras 3): a kill while the weights file is written leaves the previous.
    extra = {"double_checkpoint": True} if is_keras3(keras) else {}
    cbs.append(c.BackupAndRestore(str(where.backup), delete_checkpoint=False, **extra))
    return cbs
