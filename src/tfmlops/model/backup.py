"""The backup folder of a fit (`train`'s, or a finalist's in tune's final round): what a
killed run left, whether it is resumed (its fingerprint), and mending or clearing it.

The backup folder holds everything a killed run needs to resume: `latest.weights.h5`
+ `training_metadata.json` (Keras 3 BackupAndRestore; tf_keras: `chief/`),
`best.weights.h5` (lowest val_loss), `history.json` (one row per finished epoch) and
`fingerprint.json` (the params and data the state belongs to). Callback order
matters: BackupAndRestore comes last, so when its epoch record is written the history
row and best checkpoint of that epoch are already on disk; a kill in between replays
the epoch rather than losing it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tfmlops.artifacts import data_version
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import TEMP_PATTERN, read_json, write_bytes, write_json
from tfmlops.model.fitting import BEST_WEIGHTS, HISTORY_FILE, MONITOR, is_keras3

log = logging.getLogger(__name__)

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


def adopt_backup(backup_dir: str | Path, fingerprint: dict, keras=None, stage: str = "train") -> bool:
    """Keep a backup made with the same params and data, whole; wipe any other. True if kept."""
    folder = Path(backup_dir)
    done = finished_epochs(folder, keras)
    same = read_json(folder / FINGERPRINT_FILE, None) == fingerprint
    # Keras rewrites best.weights.h5 (ModelCheckpoint) and latest.weights.h5 in place,
    # without fsync: resumed, a torn one fails the run at its end, after training.
    damage = mend_torn_weights(folder, done) if done and same else None
    keep = bool(done) and same and damage is None
    if damage is not None:
        log.warning("%s: the backup in %s is damaged (%s; killed while Keras wrote it?); "
                    "discarded, training starts afresh", stage, folder, damage)
    elif done and not same:
        log.info(f"{stage}: discarded the backup in {folder}: made with other params or data")
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
