"""What one training run works with: the `TrainContext` every core function takes.

The stage fills it once (params, merged config, prepared data, strategy,
placement, batch, role, folders) instead of passing ten positional arguments
down the call chain.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.files import staging_dir

log = logging.getLogger(__name__)

STAGE = "train"


@dataclass
class Folders:
    """Where this worker writes: the chief's are the real ones, other workers' are scratch."""

    out: Path  # staged outputs, swapped into paths.train by the chief
    backup: Path  # BackupAndRestore state and best.weights.h5
    profile: Path  # TensorBoard / profiler traces
    history: Path  # history.json of finished epochs (the backup folder, but on tf_keras workers)


@dataclass
class TrainContext:
    """One training run: inputs, placement and where it writes (see module docstring)."""

    cfg: Config  # params.yaml as read (paths, tracking, profiling)
    merged: Config  # params <- tuned <- train.overrides: what is trained
    changes: list  # the tune merge, key by key (tune_merge.json)
    prepared: Any  # data/pipeline.Prepared
    strategy: Any  # the tf.distribute strategy
    placement: dict  # model/strategy.strategy_placement
    global_batch: int
    chief: bool
    started: float  # perf_counter at the start of the stage
    folders: Folders | None = None
    policy: str | None = None  # the resolved precision policy
    precision: Any = None  # model/precision.Decision behind `policy` (precision.json)
    done: int = 0  # epochs a killed run finished (resumed after)
    rows: list = field(default_factory=list)  # history rows of those epochs
    run: Any = None  # tracking.StageRun, once open
    model_logging: Any = None  # tracking.ModelLogging: the model being logged in a thread


def backup_fingerprint(merged: Config) -> dict:
    """What a backup was made with; a backup with another fingerprint is not resumed."""
    # the pipeline's speed settings (autotune, cache) change speed, not batches: a backup
    # made either way resumes
    blob = json.dumps({"params": merged.digest("seed", "data", "model", "train"),
                       "pipeline": merged.pipeline.without_speed_settings()},
                      sort_keys=True, default=str)
    return {"params": hashlib.sha256(blob.encode()).hexdigest()[:16],
            "data": tracking.data_version(merged)}


def worker_folders(cfg: Config, merged: Config, chief: bool, scratch: list[Path]) -> Folders:
    """This worker's folders on the Keras 3 path; the chief's are the real ones.

    A backup made with other params or data is discarded; a non-chief worker
    resumes from a copy of the chief's backup (a shared filesystem is assumed).
    """
    from tfmlops.model import callbacks as cb

    fingerprint = backup_fingerprint(merged)
    if chief:
        backup_dir = Path(cfg.paths.backup)
        had_backup = cb.finished_epochs(backup_dir) > 0
        if not cb.adopt_backup(backup_dir, fingerprint) and had_backup:
            log.info(f"train: discarded the backup in {backup_dir}: made with other params or data")
        return Folders(staging_dir(cfg.paths.train), backup_dir,
                       profiling.fresh_profile_dir(cfg, STAGE), backup_dir)
    out_dir, backup_dir, profile_dir = (scratch[0] / name for name in ("out", "backup", "tb"))
    out_dir.mkdir(parents=True)
    cb.copy_backup(cfg.paths.backup, backup_dir, fingerprint)
    return Folders(out_dir, backup_dir, profile_dir, backup_dir)
