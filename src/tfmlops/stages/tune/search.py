"""The search's identity (its key and folder), this process's role in it, and its
trials as the reports see them (keras-tuner's oracle + our side file).

The search: hyperband (default), bayesian or random over `search_space.py`,
every trial built by the shared builder, fed by the project's tf.data pipeline and
run under op determinism (with the seed: the same trials score the same). Past
`budget_minutes` of wall clock the running trial stops at its epoch's end and no
new one starts; the log, `reports/tune.json` (`budget_exhausted`) and
best_hparams.yaml's header say so (the result then depends on the machine's
speed). keras-tuner's state lives in `paths.tuner/<tuner>-<key>` (`search_key`):
rerunning resumes a killed or budget-stopped search without redoing finished
trials. The first trial of a fresh search is the params' own settings when they
lie in the space (`oracles.BaselineMixin`), so the search's best scores at least
what they score.

MLflow: the stage's run is the parent; each trial is a nested child run (status
FAILED when the trial failed; the search goes on). On the chief the runs are kept
by the tracking sidecar (tracking/sidecar.py): tune's process never imports MLflow
or matplotlib (the plots are drawn there).

Distributed search (keras-tuner's own mode, KERASTUNER_TUNER_ID /
KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT): the chief ("chief" in the
tuner id) serves the oracle, owns the parent run (tagged with the search key)
and writes every output; each worker finds that open run by its tags
(tracking.attach_run) and nests its trials under it, writing no output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfmlops.artifacts import data_version
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import MARKER, claim_folder, owned
from tfmlops.model import hparams
from tfmlops.stages.tune import search_space

log = logging.getLogger(__name__)


def search_key(cfg: Config) -> str:
    """A hash of everything a trial's result depends on, except the budgets.

    Same key: the saved search resumes (raising max_trials or budget_minutes
    extends it). Different key: a fresh search in its own folder.
    """
    d = cfg.to_dict()
    # the settings a trial takes from params (the searched ones pinned to one point)
    probe = search_space.config_from_values(cfg, search_space.reference_values(cfg.tune.space))
    tune = {k: v for k, v in d["tune"].items()
            if k not in ("enabled", "max_trials", "budget_minutes", "final_candidates")}
    if tune["pruning"]["rule"] != "halving":  # only halving reads it: a median search's key
        tune["pruning"] = {k: v for k, v in tune["pruning"].items() if k != "factor"}  # stays
    blob = {
        "seed": cfg.seed, "tune": tune, "fixed": hparams.tuned_tree(probe),
        "loss": d["train"]["loss"],
        # the pipeline's speed settings (autotune, cache) change speed, not batches
        "pipeline": cfg.pipeline.without_speed_settings(),
        "data": data_version(cfg.paths.prepared),
    }
    text = json.dumps(blob, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def project_name(cfg: Config, key: str) -> str:
    return f"{cfg.tune.tuner}-{key}"


# The marker of a keras-tuner project folder in paths.tuner (files.claim_folder): only
# such a folder is deleted when its saved state is damaged.
SEARCH_KIND = "tune-search"


def adopt_search(cfg: Config, key: str) -> Path:
    """The folder of search `key`, claimed, its saved state checked first. keras-tuner
    rewrites oracle.json and each trial.json in place, without fsync: one torn by a kill
    would fail every later run in Oracle.reload. Such a search is discarded with one
    warning and starts afresh (a damaged folder that is not ours: one error line)."""
    folder = Path(cfg.paths.tuner) / project_name(cfg, key)
    if (damage := torn_json(folder)) is not None:
        if not owned(folder, SEARCH_KIND):
            raise DataError(f"the saved search in {folder} is damaged ({damage}) and the folder "
                            f"has no {MARKER} of tfmlops; remove it to start the search afresh")
        log.warning("tune: the saved search in %s is damaged (%s; killed while keras-tuner "
                    "wrote it?); discarded, the search starts afresh", folder, damage)
        shutil.rmtree(folder)
    return claim_folder(folder, SEARCH_KIND)


def torn_json(folder: Path) -> str | None:
    """The first JSON file of a keras-tuner project that does not parse, and why; None."""
    for path in sorted([*folder.glob("*.json"), *folder.glob("trial_*/*.json")]):
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            return f"{path.relative_to(folder)}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    return None


def distributed_role() -> str:
    """single | chief | worker, from keras-tuner's own distributed-mode variables."""
    if not os.environ.get("KERASTUNER_ORACLE_IP"):
        return "single"
    return "chief" if "chief" in os.environ.get("KERASTUNER_TUNER_ID", "") else "worker"


TRIAL_FILE = "tfmlops_trial.json"  # beside keras-tuner's trial.json: seconds, child run id
ENDED = ("COMPLETED", "FAILED", "INVALID")  # keras-tuner trial statuses of a finished trial


@dataclass
class TrialRecord:
    """One trial as the reports see it (from keras-tuner's oracle + our side file)."""

    trial_id: str
    status: str  # COMPLETED | FAILED | INVALID | RUNNING (killed before it ended)
    score: float | None
    best_epoch: int | None
    values: dict[str, Any]
    seconds: float | None = None
    run_id: str | None = None
    message: str | None = None
    baseline: bool = False  # the params' own settings (the search's first trial)
    stopped_at_epoch: int | None = None  # the pruner stopped it after this epoch (pruning.py)


@dataclass
class SearchResult:
    trials: list[TrialRecord]
    ran_now: list[str]
    seconds: float
    stop_reason: str  # done | budget | failures
    profile_dir: Path | None = None


def record(project_dir: str | Path, trial, baseline: dict[str, Any] | None,
           stopped_at_epoch: int | None = None) -> TrialRecord:
    """keras-tuner's `trial` with the side file our tuner wrote in its folder (and the
    pruner's epoch, from its state file: written before the oracle ended the trial)."""
    side_path = Path(project_dir) / f"trial_{trial.trial_id}" / TRIAL_FILE
    side = json.loads(side_path.read_text()) if side_path.is_file() else {}
    values = dict(trial.hyperparameters.values)
    return TrialRecord(
        trial_id=str(trial.trial_id), status=str(trial.status),
        score=None if trial.score is None else float(trial.score),
        best_epoch=best_epoch(trial),
        values=values, seconds=side.get("seconds"), run_id=side.get("run_id"),
        message=trial.message, baseline=search_space.is_baseline(trial.trial_id, values, baseline),
        stopped_at_epoch=stopped_at_epoch)


def best_epoch(trial) -> int | None:
    """keras-tuner's best step of `trial` as an epoch counted from 1, as train.json counts."""
    return None if trial.best_step is None else trial.best_step + 1


def last_line(message: str) -> str:
    """The last non-empty line of an error message (a traceback's exception), capped."""
    lines = [line for line in str(message).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:500]
