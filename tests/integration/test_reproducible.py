"""The same model from the same commit: two cold `tune` + `train` runs of the tiny params,
each in its own fresh folder and its own processes, choose the same configuration and
train the same model (the default path: `precision: auto`, the budget as a guard)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import run_cli, tiny_params
from tfmlops.artifacts import BEST_HPARAMS, FINAL_ROUND, PRECISION

# A search with choices to make: three trials of hyperband over the default space,
# then the final round (the params' own settings against the best trial) at train's length.
SEARCH = {"tuner": "hyperband", "max_trials": 3, "max_epochs": 2, "hyperband_factor": 2,
          "budget_minutes": 60.0, "final_candidates": 1}


def untimed_rows(path: Path) -> list[dict]:
    """A CSV's rows without its wall-clock column (the one thing that may differ)."""
    with path.open() as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def cold_run(workdir: Path, prepared: Path) -> dict:
    workdir.mkdir()
    params = tiny_params(workdir, tune=SEARCH, tracking={"enabled": False})
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(prepared, workdir / "data" / "prepared")
    run_cli("tune", cwd=workdir, timeout=900)
    run_cli("train", cwd=workdir, timeout=600)
    reports, tuned = workdir / "reports", workdir / "models" / "tuned"
    return {
        "best": (tuned / BEST_HPARAMS).read_text(),
        "final_round": untimed_rows(tuned / FINAL_ROUND),
        "trials": untimed_rows(reports / "tune_trials.csv"),
        "tune": json.loads((reports / "tune.json").read_text()),
        "train": json.loads((reports / "train.json").read_text()),
        "precision": json.loads((workdir / "models" / "train" / PRECISION).read_text()),
    }


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_cold_runs_choose_and_train_the_same_model(prepared_digits, tmp_path):
    first = cold_run(tmp_path / "first", Path(prepared_digits.paths.prepared))
    second = cold_run(tmp_path / "second", Path(prepared_digits.paths.prepared))
    assert first["tune"]["budget_exhausted"] == second["tune"]["budget_exhausted"] == 0
    assert first["tune"]["trials"] == 3
    assert first["trials"] == second["trials"]  # every trial's values and score
    assert first["final_round"] == second["final_round"]
    assert first["best"] == second["best"]  # the same best_hparams.yaml, byte for byte
    assert first["precision"] == second["precision"] and first["precision"]["reason"] != "timed"
    for key in ("test_accuracy", "test_loss", "epochs_run", "best_epoch"):
        assert first["train"][key] == second["train"][key], key
