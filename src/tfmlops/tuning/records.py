"""A search's trials as the reports see them (keras-tuner's oracle + our side file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfmlops.model import search_space

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


@dataclass
class SearchResult:
    trials: list[TrialRecord]
    ran_now: list[str]
    seconds: float
    stop_reason: str  # done | budget | failures
    profile_dir: Path | None = None


def record(project_dir: str | Path, trial, baseline: dict[str, Any] | None) -> TrialRecord:
    """keras-tuner's `trial` with the side file our tuner wrote in its folder."""
    side_path = Path(project_dir) / f"trial_{trial.trial_id}" / TRIAL_FILE
    side = json.loads(side_path.read_text()) if side_path.is_file() else {}
    values = dict(trial.hyperparameters.values)
    return TrialRecord(
        trial_id=str(trial.trial_id), status=str(trial.status),
        score=None if trial.score is None else float(trial.score),
        best_epoch=trial.best_step, values=values,
        seconds=side.get("seconds"), run_id=side.get("run_id"), message=trial.message,
        baseline=search_space.is_baseline(trial.trial_id, values, baseline),
    )


def last_line(message: str) -> str:
    """The last non-empty line of an error message (a traceback's exception), capped."""
    lines = [line for line in str(message).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:500]
