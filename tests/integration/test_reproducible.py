"""The same model from the same commit: two cold `tune` + `train` runs of the tiny params,
each in its own fresh folder and its own processes, choose the same configuration and
train the same model (the default path: `precision: auto`, the budget as a guard). The
first `train` adopts tune's final-round fit, the second trains `--fresh`: the same model.
When anything that decides the weights differs, train trains afresh; a kill in the final
round resumes it."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import mlflow_client, run_cli, stage_runs, tiny_params
from tfmlops.artifacts import BEST_HPARAMS, FINAL_ROUND, MODEL_FILE, PRECISION

# A search with choices to make: three trials of hyperband over the default space,
# then the final round (the params' own settings against the best trial) at train's length.
SEARCH = {"tuner": "hyperband", "max_trials": 3, "max_epochs": 2, "hyperband_factor": 2,
          "budget_minutes": 60.0, "final_candidates": 1}


def untimed_rows(path: Path) -> list[dict]:
    """A CSV's rows without its wall-clock column (the one thing that may differ)."""
    with path.open() as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def untimed_history(path: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("epoch_seconds", "images_per_s")}
            for row in untimed_rows(path)]


def model_state(path: Path) -> dict:
    """What decides a saved model's numbers: each weight and optimizer variable by name (not
    the file's bytes: Keras stamps each save with the time)."""
    import numpy as np

    from tfmlops.model.trained import load_keras3

    model = load_keras3(path)
    return {"weights": [(v.path, np.asarray(v).tobytes()) for v in model.weights],
            "optimizer": [(v.path, np.asarray(v).tobytes()) for v in model.optimizer.variables]}


def cold_run(workdir: Path, prepared: Path, *train_args: str) -> dict:
    workdir.mkdir()
    params = tiny_params(workdir, tune=SEARCH, tracking={"enabled": False})
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(prepared, workdir / "data" / "prepared")
    run_cli("tune", cwd=workdir, timeout=900)
    trained = run_cli("train", *train_args, cwd=workdir, timeout=600)
    reports, tuned = workdir / "reports", workdir / "models" / "tuned"
    return {
        "best": (tuned / BEST_HPARAMS).read_text(),
        "final_round": untimed_rows(tuned / FINAL_ROUND),
        "trials": untimed_rows(reports / "tune_trials.csv"),
        "tune": json.loads((reports / "tune.json").read_text()),
        "train": json.loads((reports / "train.json").read_text()),
        "precision": json.loads((workdir / "models" / "train" / PRECISION).read_text()),
        "model": model_state(workdir / "models" / "train" / MODEL_FILE),
        "history": untimed_history(reports / "train_history.csv"),
        "train_log": trained.stderr,
    }


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_cold_runs_choose_and_train_the_same_model(prepared_digits, tmp_path):
    first = cold_run(tmp_path / "first", Path(prepared_digits.paths.prepared))
    second = cold_run(tmp_path / "second", Path(prepared_digits.paths.prepared), "--fresh")
    assert first["tune"]["budget_exhausted"] == second["tune"]["budget_exhausted"] == 0
    assert first["tune"]["trials"] == 3
    assert first["trials"] == second["trials"]  # every trial's values and score
    assert first["final_round"] == second["final_round"]
    assert first["best"] == second["best"]  # the same best_hparams.yaml, byte for byte
    assert first["precision"] == second["precision"] and first["precision"]["reason"] != "timed"
    for key in ("test_accuracy", "test_loss", "epochs_run", "best_epoch"):
        assert first["train"][key] == second["train"][key], key
    # the first train adopted the final round's fit, the second fitted: the same model
    assert (first["train"]["adopted"], second["train"]["adopted"]) == (1, 0)
    assert "adopted tune's final-round fit of" in first["train_log"]
    assert "adopted" not in second["train_log"]
    assert first["model"]["weights"] == second["model"]["weights"]
    assert first["model"]["optimizer"] == second["model"]["optimizer"]
    assert first["history"] == second["history"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_adopts_only_a_fit_made_with_its_own_fingerprint(digits_workdir, make_cfg, caplog):
    """The adopted run names the final round's run and holds the per-epoch metrics a fresh
    fit logs. A stored fit made by other fitting code, or with a train param the search
    does not read (train.label_issues), is not adopted: train fits afresh."""
    from tfmlops.model import kept_fit
    from tfmlops.stages import train, tune

    caplog.set_level("INFO", logger="tfmlops")
    sections = {"tune": {"max_trials": 1, "max_epochs": 1, "final_candidates": 1},
                "train": {"epochs": 2}}
    cfg = digits_workdir(**sections)
    tune.run(cfg)
    assert train.run(cfg)["adopted"] == 1
    (run,) = stage_runs(cfg, "train")
    client = mlflow_client(cfg)
    (final_params,) = [r for r in stage_runs(cfg, "tune") if r.info.run_name == "final-params"]
    assert run.data.tags["tfmlops.adopted_from_run"] == final_params.info.run_id
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [1, 2]
    assert run.data.metrics["adopted"] == 1

    stored = Path(cfg.paths.tuned) / kept_fit.KEPT_FIT / kept_fit.FINGERPRINT
    made = json.loads(stored.read_text())
    stored.write_text(json.dumps({**made, "code": "0" * 16}))  # fitted by other code
    caplog.clear()
    assert train.run(cfg)["adopted"] == 0
    assert "not adopted (it differs in code)" in caplog.text
    stored.write_text(json.dumps(made))

    changed = make_cfg(**{**sections, "train": {**sections["train"], "label_issues": 7}})
    caplog.clear()
    assert train.run(changed)["adopted"] == 0
    assert "not adopted (it differs in params)" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_final_round_killed_mid_fit_resumes_and_train_adopts_it(prepared_digits, tmp_path):
    """`tfmlops tune` SIGKILLed at the end of the params finalist's second epoch (its first
    backed up), then run again: that finalist resumes after epoch 1, the round completes
    and train adopts the winner. A third tune keeps both sealed fits."""
    import signal
    import subprocess

    from conftest import VENV_BIN, child_env

    params = tiny_params(tmp_path, tune={"max_trials": 1, "max_epochs": 1, "final_candidates": 1},
                         train={"epochs": 3}, tracking={"enabled": False})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(prepared_digits.paths.prepared, tmp_path / "data" / "prepared")
    killed = subprocess.run([str(VENV_BIN / "tfmlops"), "tune"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600,
                            env={**child_env(), "TFMLOPS_FAULT": "tune.final_epoch_end@2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "models" / "tuned" / FINAL_ROUND).exists()

    resumed = run_cli("tune", cwd=tmp_path, timeout=600).stderr
    assert "final round: params resumes after epoch 1 of 3" in resumed
    rows = untimed_rows(tmp_path / "models" / "tuned" / FINAL_ROUND)
    assert [r["epochs"] for r in rows] == ["3"] * len(rows) and not any(r["error"] for r in rows)
    again = run_cli("tune", cwd=tmp_path, timeout=600).stderr
    assert again.count("was already fitted with these params, data and code; kept") == len(rows)
    assert untimed_rows(tmp_path / "models" / "tuned" / FINAL_ROUND) == rows
    run_cli("train", cwd=tmp_path, timeout=600)
    assert json.loads((tmp_path / "reports" / "train.json").read_text())["adopted"] == 1
