"""How `train` fits a model, on one machine (Keras 3) or across workers (tf_keras):
the batches, the compiled model, op determinism, precision, fine-tuning phases, the
callbacks, and the backup folder a killed run resumes from. Functions that touch Keras
take the keras module (as model/builder.py does), so both paths are this code.

Keras 3's `fit` fails under a MultiWorkerMirroredStrategy spanning several workers
(keras-team/keras#20585, open; Keras 3.15.1, TF 2.21: "PerReplica ... to a Tensor");
tf_keras' `fit` runs the same strategy and is importable beside Keras 3. Where the
multi-worker path differs, and why (`Setup.across_workers`):
- `train.optimizer.name: lamb` is refused (tf_keras has no Lamb) and
  `train.jit_compile: auto` means tf_keras' default (no XLA);
- every worker passes the same `paths.backup` to tf_keras' BackupAndRestore and
  ModelCheckpoint: the chief writes there (`chief/` TF checkpoints, `best.weights.h5`),
  each other worker to its own `workertemp_<task>` folder, which it deletes (saving
  involves collective ops, so all workers save). `paths.backup` must be on a
  filesystem every worker sees; a non-chief's history and traces go to its scratch;
- one phase, the whole backbone trainable (fine-tuning is not built for it);
- after `fit` no collective op is left: other workers stop, the chief copies the
  weights into the Keras 3 twin (`final_model`) and saves what one machine saves.

The backup folder holds everything a killed run needs to resume: `latest.weights.h5`
+ `training_metadata.json` (Keras 3 BackupAndRestore; tf_keras: `chief/`),
`best.weights.h5` (lowest val_loss), `history.json` (one row per finished epoch) and
`fingerprint.json` (the params and data the state belongs to). Callback order
matters: BackupAndRestore comes last, so when its epoch record is written the history
row and best checkpoint of that epoch are already on disk; a kill in between replays
the epoch rather than losing it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfmlops import faults, profiling, tracking
from tfmlops.artifacts import data_version
from tfmlops.config import Config
from tfmlops.errors import ConfigError, DataError
from tfmlops.files import TEMP_PATTERN, read_json, write_bytes, write_json

log = logging.getLogger(__name__)

JIT = {"true": True, "false": False}  # `auto`: Keras 3's "auto", tf_keras' None (its default)
TF_KERAS_OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")

MONITOR = "val_loss"  # smoother than val_accuracy on a small validation split
BEST_WEIGHTS = "best.weights.h5"
HISTORY_FILE = "history.json"
FINGERPRINT_FILE = "fingerprint.json"
BACKUP_META = "training_metadata.json"
BACKUP_WEIGHTS = "latest.weights.h5"
CHIEF_CHECKPOINTS = "chief"  # tf_keras' BackupAndRestore keeps the chief's state here
EPOCH_KEY = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"  # 0-based index of the last epoch
BACKUP_FORMAT = "tf_keras-multi-worker"  # in the fingerprint: never resumed by the Keras 3 path
# What train leaves in paths.backup: its files and Keras' (`.bkp`: the previous
# state), tf_keras' multi-worker folders, files.write_bytes' temp files.
BACKUP_NAMES = re.compile(
    r"(latest\.weights\.h5|training_metadata\.json|best\.weights\.h5|history\.json"
    r"|fingerprint\.json)(\.bkp)?|chief|workertemp_\d+|" + TEMP_PATTERN)
HISTORY_COLUMNS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate",
                   "epoch_seconds", "images_per_s", "phase")  # phase: fine-tuning runs only


def is_keras3(keras) -> bool:
    return keras.__version__[0] == "3"


# ------------------------------------------------------------ the run's setup

@dataclass(frozen=True)
class Setup:
    keras: Any  # Keras 3, or tf_keras across several workers
    strategy: Any
    placement: dict  # model/strategy.strategy_placement
    global_batch: int
    chief: bool
    across_workers: bool  # MultiWorkerMirroredStrategy over more than one worker (tf_keras)


def setup(cfg: Config, merged: Config, prepared) -> Setup:
    """The strategy (before any other TensorFlow op: logical CPUs and collective ops
    cannot be set up later in a process) and the keras module that fits under it."""
    from tfmlops.model import strategy as dist

    tf_config = os.environ.get("TF_CONFIG")
    kind = dist.resolve_strategy(merged.train.strategy, tf_config, dist.visible_gpus())
    # one worker fits in Keras 3; several in tf_keras (the module docstring says why)
    across = kind == "multi_worker" and dist.cluster_tasks(tf_config) > 1
    if across:
        tracking.preflight(cfg)  # the chief's store is away: fail now, before any worker waits
        if merged.train.optimizer.name not in TF_KERAS_OPTIMIZERS:
            raise ConfigError(
                f"train.optimizer.name: {merged.train.optimizer.name} is not available in "
                f"tf_keras, which multi-worker training uses; use one of "
                f"{', '.join(TF_KERAS_OPTIMIZERS)}")
        import tf_keras as keras
    else:
        import keras
    dist.prepare_devices(kind, merged.train.replicas)
    strategy = dist.make_strategy(kind, merged.train.replicas)
    placement = dist.strategy_placement(strategy, kind)
    global_batch = merged.train.batch_size * placement["replicas"]
    if global_batch > prepared.counts["train"]:
        raise DataError(
            f"train.batch_size {merged.train.batch_size} x {placement['replicas']} replica(s) = "
            f"{global_batch} is more than the {prepared.counts['train']} train images; lower "
            "train.batch_size (or train.overrides / tune's batch_size)")
    return Setup(keras, strategy, placement, global_batch, tracking.is_chief(), across)


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


def decide_precision(merged: Config, prepared, batch_size: int, *, timed: bool = True,
                     cache_file: str | Path | None = None, write: bool = True, flags=None):
    """`merged.train.precision` resolved for this model and batch (model/precision.py),
    logged when decided now. A timing consumes seeds: set them after this call.
    `cache_file`: the timed decisions to reuse (`write`: add this one to it); `flags`:
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

    decision, now = precision.decide_cached(
        merged.train.precision, key, flags, measure if timed else None, cache_file, write,
        spec=merged.model, margin=merged.train.precision_margin)
    if now:
        log.info(decision.line(merged.train.precision))
    return decision


def log_precision(run, decision) -> None:
    """The decision into a run: params `resolved.precision_*`, metrics of each timing."""
    params, metrics = decision.mlflow()
    run.log_params({"resolved": params})
    if metrics:
        run.log_metrics(metrics)


def best_val_loss(rows: list[dict]) -> float | None:
    """The lowest val_loss of the resumed epochs (the checkpoint's threshold)."""
    val_losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return min(val_losses) if val_losses else None


# ------------------------------------------------------------ the backup folder

@dataclass(frozen=True)
class Folders:
    """Where this worker writes: the chief's are the real ones, other workers' are scratch."""

    backup: Path  # BackupAndRestore state and best.weights.h5
    profile: Path  # TensorBoard / profiler traces
    history: Path  # history.json of finished epochs (the backup, but on tf_keras workers)


@dataclass(frozen=True)
class Resume:
    """What a killed run left: its finished epochs and their history rows."""

    done: int
    rows: list  # this worker's rows of those epochs
    best_so_far: float | None  # the lowest val_loss of the shared backup's rows


def backup_fingerprint(merged: Config, keras) -> dict:
    """What a backup was made with; a backup with another fingerprint is not resumed."""
    # the pipeline's speed settings change speed, not batches: a backup made either way resumes
    blob = json.dumps({"params": merged.digest("seed", "data", "model", "train"),
                       "pipeline": merged.pipeline.without_speed_settings()},
                      sort_keys=True, default=str)
    found = {"params": hashlib.sha256(blob.encode()).hexdigest()[:16],
             "data": data_version(merged.paths.prepared)}
    return found if is_keras3(keras) else {**found, "format": BACKUP_FORMAT}


def folders(cfg: Config, merged: Config, run_setup: Setup, profile: Path,
            scratch: Path | None) -> Folders:
    """The chief adopts the backup in paths.backup (one made with other params or data is
    discarded); other workers (tf_keras, which redirects their writes) pass it too, with
    history and traces in their scratch folder."""
    backup = Path(cfg.paths.backup)
    if scratch is not None:
        (scratch / "history").mkdir(parents=True)
        return Folders(backup, scratch / "tb", scratch / "history")
    adopt_backup(backup, backup_fingerprint(merged, run_setup.keras), run_setup.keras)
    return Folders(backup, profile, backup)


def resume(cfg: Config, merged: Config, run_setup: Setup, where: Folders) -> Resume:
    done = finished_epochs(where.backup, run_setup.keras)
    if done and run_setup.chief:
        log.info(f"train: resuming after epoch {done} of {merged.train.epochs} from the "
                 f"backup in {cfg.paths.backup}")

    def rows(folder: Path) -> list[dict]:
        return [r for r in history_rows(folder) if r["epoch"] <= done]

    # The checkpoint's threshold comes from the shared backup's rows, the same on every
    # worker: one that saves the best weights when the chief does not waits in a
    # collective the chief never joins.
    return Resume(done, rows(where.history), best_val_loss(rows(where.backup)))


def finished_epochs(backup_dir: str | Path, keras=None) -> int:
    """Epochs the backup in `backup_dir` has finished (0: nothing to resume); `keras`
    tf_keras: the multi-worker backup (`chief_finished_epochs`)."""
    if keras is not None and not is_keras3(keras):
        return chief_finished_epochs(backup_dir)
    if not (Path(backup_dir) / BACKUP_WEIGHTS).is_file():
        return 0
    try:  # no or an unreadable metadata file: {} (a kill mid-write)
        return int(read_json(Path(backup_dir) / BACKUP_META, {})["epoch"])
    except (ValueError, KeyError, TypeError):
        return 0


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


def history_rows(backup_dir: str | Path) -> list[dict]:
    return sorted(read_json(Path(backup_dir) / HISTORY_FILE, []), key=lambda r: r["epoch"])


def adopt_backup(backup_dir: str | Path, fingerprint: dict, keras=None) -> bool:
    """Keep a backup made with the same params and data, whole; wipe any other. True if kept."""
    folder = Path(backup_dir)
    done = finished_epochs(folder, keras)
    same = read_json(folder / FINGERPRINT_FILE, None) == fingerprint
    # Keras rewrites best.weights.h5 (ModelCheckpoint) and latest.weights.h5 in place,
    # without fsync: resumed, a torn one fails the run at its end, after training.
    damage = mend_torn_weights(folder, done) if done and same else None
    keep = bool(done) and same and damage is None
    if damage is not None:
        log.warning("train: the backup in %s is damaged (%s; killed while Keras wrote it?); "
                    "discarded, training starts afresh", folder, damage)
    elif done and not same:
        log.info(f"train: discarded the backup in {folder}: made with other params or data")
    if not keep:
        clear(folder)
        write_json(folder / FINGERPRINT_FILE, fingerprint)
    return keep


def mend_torn_weights(folder: Path, done: int) -> str | None:
    """What makes a backup unusable, or None once it is usable.

    latest.weights.h5: Keras 3's double checkpoint loads latest.weights.h5.bkp when it
    does not read; unusable only when neither does. best.weights.h5: each epoch's end
    writes the history row, then best.weights.h5 (if the epoch improved), then the backup.
    A kill in that window tears the best file of epoch `done + 1`, which the history
    shows as a newer improving row: the resumed run trains that epoch again and saves it
    again. Until then the file holds the backed-up epoch's weights (the run's end always
    has a whole file to load). A torn best file that no newer row explains (a power cut)
    leaves no way to know the best epoch's weights: unusable."""
    latest = {p: unreadable(p) for p in (folder / BACKUP_WEIGHTS, folder / f"{BACKUP_WEIGHTS}.bkp")
              if p.exists()}
    readable = [p for p, why in latest.items() if why is None]
    if latest and not readable:
        return next(iter(latest.values()))
    best = folder / BEST_WEIGHTS
    why = unreadable(best) if best.exists() else None
    if why is None:
        return None
    if not readable or not _best_was_being_saved(folder, done):
        return why
    write_bytes(best, readable[0].read_bytes())
    log.warning("train: %s was torn by a kill as epoch %d was saved (%s); it holds epoch %d's "
                "weights until the resumed run saves epoch %d again", best, done + 1, why, done,
                done + 1)
    return None


def _best_was_being_saved(folder: Path, done: int) -> bool:
    """Whether the history's newest row is epoch `done + 1` and improved on every earlier one."""
    rows = read_json(folder / HISTORY_FILE, [])
    if not isinstance(rows, list) or not rows or rows[-1].get("epoch") != done + 1:
        return False
    losses = [r.get(MONITOR) for r in rows]
    if any(v is None for v in losses):
        return False
    return all(losses[-1] < v for v in losses[:-1])


def unreadable(path: Path) -> str | None:
    """Why the HDF5 weights file `path` does not read whole (every dataset), or None."""
    import h5py

    def read(_name, item) -> None:  # None: visititems goes on
        if isinstance(item, h5py.Dataset):
            item[()]

    try:
        with h5py.File(path, "r") as weights:
            weights.visititems(read)
    except Exception as exc:  # noqa: BLE001 - h5py raises OSError, KeyError, RuntimeError...
        return f"{path.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def clear(backup_dir: str | Path) -> None:
    """Empty the folder of what train writes there, but keep it: DVC expects the
    declared output to exist.

    Only a folder that is train's backup (its marker: the fingerprint.json train
    writes before anything else) is emptied, and only of the names train and Keras
    write; a foreign folder with files in it is refused before anything is deleted.
    """
    folder = Path(backup_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / FINGERPRINT_FILE).is_file():
        foreign = sorted(p.name for p in folder.iterdir())
        if foreign:
            raise DataError(f"paths.backup {folder} holds files train did not write "
                            f"({foreign[0]}{', ...' if len(foreign) > 1 else ''}); empty it or "
                            "point paths.backup at a folder of its own")
    for path in folder.iterdir():
        if not BACKUP_NAMES.fullmatch(path.name):
            log.warning("train: %s is not a backup file; left in place", path)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ------------------------------------------------------------- callbacks

@functools.cache
def _recorder_class(keras):
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
            faults.point("train.epoch_end")
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


# ------------------------------------------------------------- fit

@dataclass(frozen=True)
class Fitted:
    """What `fit` made: the model (in the setup's keras), its history and fit time."""

    model: Any
    rows: list  # every epoch's row, a resumed run's included
    seconds: float


def fit(cfg: Config, merged: Config, prepared, run_setup: Setup, policy: str, where: Folders,
        resumed: Resume, run) -> Fitted:
    """Build (in the strategy's scope), then fit in phases under `policy`."""
    from tfmlops.model import precision
    from tfmlops.progress import keras_verbose

    keras = run_setup.keras
    train_ds, _, steps_per_epoch = data = datasets(merged, prepared, run_setup.global_batch)
    plan = phases(merged)
    resolved = {}
    if run_setup.across_workers:
        resolved["auto_shard_policy"] = _shard_policy(train_ds)
        log.info(f"train: {task_name(run_setup.strategy)} of {run_setup.placement['workers']} "
                 f"workers, {run_setup.strategy.num_replicas_in_sync} replicas, global batch "
                 f"{run_setup.global_batch}, auto-shard {resolved['auto_shard_policy']}")
        if len(plan) > 1:  # not built for tf_keras fit across workers
            log.warning("train: train.fine_tune is ignored across workers: one phase, the "
                        "whole backbone trainable")
        plan = [Phase(1, 0, merged.train.epochs, None)]
    with precision.global_policy(policy, keras):
        with run_setup.strategy.scope():
            # compiled once here for the checks below; each phase recompiles in the scope
            model = compiled_model(merged, prepared, keras, steps_per_epoch * merged.train.epochs)
        scaled = precision.uses_loss_scaling(model, keras)
        if policy == "mixed_float16" and not scaled:
            raise RuntimeError("mixed_float16 without a LossScaleOptimizer: float16 gradients "
                               "would underflow")
        run.log_params({"resolved": {"jit_compile": bool(model.jit_compile),
                                     "loss_scaling": scaled, "fine_tune_phases": len(plan),
                                     **resolved}})
        recorder = _recorder_class(keras)(where.history, prepared.counts["train"], run,
                                          resumed.rows)

        def callbacks(phase: Phase) -> list:
            recorder.phase = phase.number if len(plan) > 1 else None
            return training_callbacks(
                keras, merged.train, where, profiling.keras_profile_batch(cfg, steps_per_epoch),
                recorder, resumed.best_so_far if run_setup.across_workers
                else best_val_loss(recorder.rows))

        started = time.perf_counter()
        with run_setup.strategy.scope():  # each phase compiles: its optimizer's variables here
            fit_in_phases(model, merged, prepared, keras, data, plan, callbacks,
                          keras_verbose() if run_setup.chief else 0, resumed.done)
        return Fitted(model, recorder.rows, time.perf_counter() - started)


def final_model(fitted: Fitted, merged: Config, prepared, run_setup: Setup, best: Path):
    """The Keras 3 model to save, with the weights of the epoch with the lowest val_loss.

    Across workers the tf_keras weights pass through a tf_keras model outside the
    strategy, so loading `best.weights.h5` (tf_keras' h5 layout) touches no distributed
    variable; the Keras 3 twin's optimizer is fresh (later stages never resume training).
    Reading the weights all-reduces (BatchNorm statistics): every worker calls this.
    """
    if not run_setup.across_workers:
        if best.is_file():
            fitted.model.load_weights(best)
        return fitted.model
    import keras
    import tf_keras

    weights = fitted.model.get_weights()
    if not run_setup.chief:
        return None  # no collective op is left: the chief finishes alone
    local = built_model(merged, prepared, tf_keras, pretrained=False)
    local.set_weights(weights)
    if best.is_file():
        local.load_weights(best)
    twin = compiled_model(merged, prepared, keras,
                          steps(prepared, run_setup.global_batch) * merged.train.epochs,
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


def task_name(strategy) -> str:
    resolver = strategy.cluster_resolver
    return f"{resolver.task_type}:{resolver.task_id}"
