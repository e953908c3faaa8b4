"""One finalist of tune's final round, fitted as `train` fits it and kept as train
would keep it, so train can adopt the winner's fit instead of training it again
(model/kept_fit.py says when it does).

Per finalist, in `paths.tuner/final/<name>/`: the kept fit (model.keras with the
best epoch's weights, history.json, fit.json, profile/, fingerprint.json last) and
`backup/`, train's backup folder (model/backup.py): BackupAndRestore, the best
checkpoint and the history rows. A kill in the round resumes each finalist after its
last finished epoch; a finalist sealed before the kill is not fitted again.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from tfmlops import faults, files, profiling, tracking
from tfmlops.artifacts import MODEL_FILE, PRECISION
from tfmlops.config import Config
from tfmlops.files import write_json
from tfmlops.model import backup, fitting, kept_fit
from tfmlops.model.fitting import HISTORY_FILE

log = logging.getLogger(__name__)

FINAL_DIR = "final"  # paths.tuner/final/<finalist>
BACKUP_DIR = "backup"
FAULT = "tune.final_epoch_end"  # a test kills the round at an epoch's end (`@<n>`)


FINALIST_KIND = "tune-finalist"  # the marker forget_others needs before it deletes


def finalist_dir(cfg: Config, name: str) -> Path:
    """The finalist's folder, made and marked as the project's own."""
    return files.claim_folder(Path(cfg.paths.tuner) / FINAL_DIR / name, FINALIST_KIND)


def forget_others(cfg: Config, names: list[str]) -> None:
    """Remove the kept fits of finalists this round does not have (an earlier search's):
    only folders this project made (files.owned_children), never anything else there."""
    root = Path(cfg.paths.tuner) / FINAL_DIR
    for folder in files.owned_children(root, FINALIST_KIND, r"params|trial-.+"):
        if folder.name not in names:
            shutil.rmtree(folder, ignore_errors=True)


def fresh_keras_state(keras) -> None:
    """A fresh process's Keras state (layer names, graphs), as train starts with: the
    round runs in a process that has just built every trial's model (keras-tuner clears
    before each trial, not after the last). Called before the seed: the same numbers."""
    keras.backend.clear_session()


def fit_as_train(merged: Config, prepared, child: tracking.StageRun, max_params: int,
                 folder: Path) -> list[dict]:
    """train's fit of `merged` on one device, kept in `folder`; its history rows."""
    import keras

    from tfmlops.model import precision

    fresh_keras_state(keras)
    t = merged.train
    with fitting.op_determinism(merged.pipeline.deterministic):
        # Timed once per architecture (the search's trials share the file); before the seed.
        decision = fitting.choose_precision(merged, prepared, t.batch_size,
                                            cache_file=Path(merged.paths.tuner) / PRECISION)
        fitting.log_precision(child, decision)
        print_ = kept_fit.fingerprint(merged, keras, decision.policy, kept_fit.ONE_DEVICE)
        if kept_fit.is_whole(folder, print_):  # fitted before a kill, or by the same round
            log.info(f"tune: final round: {folder.name} was already fitted with these params, "
                     "data and code; kept")
            rows = kept_fit.history_of(folder)
            _log_rows(child, rows)
            return rows
        keras.utils.set_random_seed(merged.seed)
        with precision.global_policy(decision.policy, keras):
            return _fit(merged, prepared, child, max_params, folder, print_, keras)


def _fit(merged: Config, prepared, child, max_params: int, folder: Path, print_: dict,
         keras) -> list[dict]:
    from tfmlops.model import precision
    from tfmlops.progress import keras_verbose

    (folder / kept_fit.FINGERPRINT).unlink(missing_ok=True)  # unsealed until the end
    where = fitting.Folders(folder / BACKUP_DIR, folder / kept_fit.PROFILE, folder / BACKUP_DIR)
    if not backup.adopt_backup(where.backup, print_, keras, stage="tune"):
        shutil.rmtree(where.profile, ignore_errors=True)
    done = backup.finished_epochs(where.backup)
    if done >= merged.train.epochs:  # killed while sealing: the backup holds no optimizer slots
        backup.clear(where.backup)
        backup.adopt_backup(where.backup, print_, keras, stage="tune")
        done = 0
    resumed = [r for r in backup.history_rows(where.backup) if r["epoch"] <= done]
    if done:
        log.info(f"tune: final round: {folder.name} resumes after epoch {done} of "
                 f"{merged.train.epochs} from its backup in {where.backup}")
        _log_rows(child, resumed)
    data = fitting.datasets(merged, prepared, merged.train.batch_size)
    # compiled once before the phases recompile, as train does: the same optimizer names
    model = fitting.compiled_model(merged, prepared, keras, data[2] * merged.train.epochs)
    if max_params and model.count_params() > max_params:  # as the search fails it
        raise ValueError(f"Oversized model: {model.count_params()} parameters, more "
                         f"than tune.max_model_params {max_params}")
    plan = fitting.phases(merged)
    recorder = fitting.recorder_class(keras)(where.history, prepared.counts["train"],
                                             tracking.StageRun(merged, "tune", None, None), resumed)
    recorder.fault_point = FAULT
    log_epochs = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: child.log_metrics(dict(logs or {}), step=epoch))

    def callbacks(phase):  # fresh each phase, as train's
        recorder.phase = phase.number if len(plan) > 1 else None
        return [log_epochs, *fitting.training_callbacks(
            keras, merged.train, where, profiling.keras_profile_batch(merged, data[2]), recorder,
            fitting.best_val_loss(recorder.rows))]

    started = time.perf_counter()
    fitting.fit_in_phases(model, merged, prepared, keras, data, plan, callbacks,
                          keras_verbose(), done)
    seconds = time.perf_counter() - started
    if (where.backup / fitting.BEST_WEIGHTS).is_file():  # as train's model_to_save
        model.load_weights(where.backup / fitting.BEST_WEIGHTS)
    model.save(folder / MODEL_FILE)
    write_json(folder / HISTORY_FILE, recorder.rows)
    kept_fit.seal(folder, print_, {
        "candidate": folder.name, "run_id": child.run_id, "fit_seconds": round(seconds, 2),
        "resumed_after_epoch": done,
        "resolved": {"jit_compile": bool(model.jit_compile),
                     "loss_scaling": precision.uses_loss_scaling(model, keras),
                     "fine_tune_phases": len(plan)}})
    faults.point("tune.finalist_kept")
    return recorder.rows


def _log_rows(child, rows: list[dict]) -> None:
    """Epochs fitted before (a kill, or an earlier round) into this round's run, at the
    steps the round logs (0-based, as Keras' epoch)."""
    for row in rows:
        child.log_metrics(fitting.metrics_of(row), step=row["epoch"] - 1)


def keep_winner(cfg: Config, out: Path, winner) -> None:
    """The winner's kept fit into paths.tuned (staging `out`), for train to adopt."""
    folder = finalist_dir(cfg, winner.name)
    if (folder / kept_fit.FINGERPRINT).is_file():
        kept_fit.copy(folder, out / kept_fit.KEPT_FIT)
