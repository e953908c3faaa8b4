"""The Keras callbacks of a training run, and the backup folder they share.

The backup folder (`paths.backup` on the chief, a private temp folder on
other workers) holds everything a killed run needs to resume:
`latest.weights.h5` + `training_metadata.json` (BackupAndRestore: weights,
optimizer state, last finished epoch), `best.weights.h5` (ModelCheckpoint of
the lowest val_loss), `history.json` (one row per finished epoch) and
`fingerprint.json` (the params and data the state belongs to).

Callback order matters: BackupAndRestore comes last, so when its epoch
record is written the history row and best checkpoint of that epoch are
already on disk; a kill in between replays the epoch rather than losing it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

import keras

from tfmlops.errors import DataError
from tfmlops.files import TEMP_PATTERN, write_json
from tfmlops.model.precision import inner_optimizer

log = logging.getLogger(__name__)
MONITOR = "val_loss"  # smoother than val_accuracy on a small validation split
BEST_WEIGHTS = "best.weights.h5"
HISTORY_FILE = "history.json"
FINGERPRINT_FILE = "fingerprint.json"
BACKUP_META = "training_metadata.json"
BACKUP_WEIGHTS = "latest.weights.h5"
# What train leaves in paths.backup: its files and Keras' (`.bkp`: the previous
# state), tf_keras' multi-worker folders, files.write_bytes' temp files.
BACKUP_NAMES = re.compile(
    r"(latest\.weights\.h5|training_metadata\.json|best\.weights\.h5|history\.json"
    r"|fingerprint\.json)(\.bkp)?|chief|workertemp_\d+|" + TEMP_PATTERN)
HISTORY_COLUMNS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate",
                   "epoch_seconds", "images_per_s", "phase")  # phase: fine-tuning runs only


# ------------------------------------------------------------ backup folder

def finished_epochs(backup_dir: str | Path) -> int:
    """Epochs the backup in `backup_dir` has finished (0: nothing to resume)."""
    meta = Path(backup_dir) / BACKUP_META
    if not meta.is_file() or not (Path(backup_dir) / BACKUP_WEIGHTS).is_file():
        return 0
    try:
        return int(json.loads(meta.read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def history_rows(backup_dir: str | Path) -> list[dict]:
    path = Path(backup_dir) / HISTORY_FILE
    try:
        rows = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        return []
    return sorted(rows, key=lambda r: r["epoch"])


def matches(backup_dir: str | Path, fingerprint: dict) -> bool:
    path = Path(backup_dir) / FINGERPRINT_FILE
    try:
        return path.is_file() and json.loads(path.read_text()) == fingerprint
    except (OSError, ValueError):
        return False


def adopt_backup(backup_dir: str | Path, fingerprint: dict) -> bool:
    """Keep a backup made with the same params and data; wipe any other. True if kept."""
    folder = Path(backup_dir)
    keep = finished_epochs(folder) > 0 and matches(folder, fingerprint)
    if not keep:
        clear(folder)
        write_json(folder / FINGERPRINT_FILE, fingerprint)
    return keep


def copy_backup(source: str | Path, target: str | Path, fingerprint: dict) -> None:
    """A non-chief worker resumes from the chief's backup (shared filesystem)."""
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if finished_epochs(source) and matches(source, fingerprint):
        for path in source.iterdir():
            if path.is_file():
                shutil.copy2(path, target / path.name)
    write_json(target / FINGERPRINT_FILE, fingerprint)


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

class EpochRecorder(keras.callbacks.Callback):
    """One row per epoch: metrics, learning rate, epoch seconds and images/s.

    Rows are persisted in the backup folder (a resumed run keeps its earlier
    epochs) and sent to the run's MLflow (`run.log_metrics(step=epoch)`; the
    run is a no-op off the chief). `epoch` counts from 1; the epochs of a
    two-phase fine-tuning run carry its `phase` (1: backbone frozen, 2: top unfrozen),
    one MLflow history whose steps continue across the phases.
    """

    def __init__(self, backup_dir: str | Path, train_images: int, run, rows: list[dict]):
        super().__init__()
        self.history_file = Path(backup_dir) / HISTORY_FILE
        self.train_images = train_images
        self.run = run
        self.rows = list(rows)
        self._started = False
        self._epoch_start = 0.0
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
        logs = logs or {}
        epoch_seconds = time.perf_counter() - self._epoch_start
        train_seconds = self._train_seconds or epoch_seconds
        row = {"epoch": epoch + 1, **{k: _float(logs.get(k)) for k in HISTORY_COLUMNS[1:5]},
               "learning_rate": self.learning_rate(),
               "epoch_seconds": round(epoch_seconds, 4),
               "images_per_s": round(self.train_images / max(train_seconds, 1e-9), 1)}
        if self.phase is not None:
            row["phase"] = self.phase
        self.rows.append(row)
        write_json(self.history_file, self.rows)
        self.run.log_metrics(metrics_of(row), step=row["epoch"])

    def learning_rate(self) -> float:
        optimizer = inner_optimizer(self.model.optimizer)
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def metrics_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "epoch" and v is not None}


def _float(value) -> float | None:
    return None if value is None else float(value)


def stopping_callbacks(early_stopping_patience: int, reduce_lr_on_plateau: bool) -> list:
    """The callbacks that change what a run learns (also used by tune's final round)."""
    cbs = []
    if early_stopping_patience:
        cbs.append(keras.callbacks.EarlyStopping(monitor=MONITOR, mode="min",
                                                 patience=early_stopping_patience))
    if reduce_lr_on_plateau:
        cbs.append(keras.callbacks.ReduceLROnPlateau(monitor=MONITOR, mode="min", factor=0.5,
                                                     patience=2, min_lr=1e-6))
    return cbs


def training_callbacks(*, backup_dir: Path, profile_dir: Path, profile_batch, recorder,
                       early_stopping_patience: int, reduce_lr_on_plateau: bool,
                       best_so_far: float | None) -> list:
    """The callback list of a run, in the order the module docstring explains."""
    cbs = [
        recorder,
        keras.callbacks.ModelCheckpoint(
            str(backup_dir / BEST_WEIGHTS), monitor=MONITOR, mode="min", save_best_only=True,
            save_weights_only=True, initial_value_threshold=best_so_far,
        ),
    ]
    cbs += stopping_callbacks(early_stopping_patience, reduce_lr_on_plateau)
    cbs.append(keras.callbacks.TensorBoard(log_dir=str(profile_dir), profile_batch=profile_batch,
                                           write_graph=False))
    # double_checkpoint: a kill while the weights file is written leaves the previous one.
    cbs.append(keras.callbacks.BackupAndRestore(str(backup_dir), double_checkpoint=True,
                                                delete_checkpoint=False))
    return cbs
