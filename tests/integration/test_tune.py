"""The tune stage end to end on tiny searches: real keras-tuner, TensorFlow, MLflow (SQLite)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from conftest import (
    dvc,
    mlflow_client,
    relative_tiny_params,
    run_cli,
    scratch_repo,
    stage_runs,
    tiny_params,
)
from tfmlops.artifacts import BEST_HPARAMS, FINAL_ROUND, RUN_FILE, TAG_TUNE_SEARCH
from tfmlops.config import replace
from tfmlops.errors import DataError
from tfmlops.files import MARKER
from tfmlops.model import hparams
from tfmlops.stages.tune import search_space
from tfmlops.stages.tune.search import search_key

# Tiny but real: 1-2 small blocks, few trials, one epoch each.
TINY_SPACE = {
    "blocks": {"min": 1, "max": 2, "step": 1},
    "filters": [4, 8],
    "separable": [False, True],
    "batch_norm": [True, False],
    "dropout": {"min": 0.0, "max": 0.2},
    "head_units": [16, 32],
    "optimizer": ["adam", "adamw"],
    "learning_rate": {"min": 0.001, "max": 0.01},
    "schedule": ["constant", "cosine_warmup", "exponential_decay"],
    "warmup_fraction": {"min": 0.0, "max": 0.2},
    "decay_rate": {"min": 0.3, "max": 0.9},
    "batch_size": [64, 128],
}


def tune_params(**tune):
    # final_candidates 0: these tests are about the search; the final round has its own
    return {"tune": {"tuner": "random", "max_trials": 3, "max_epochs": 1, "space": TINY_SPACE,
                     "final_candidates": 0, **tune}}


def children_of(cfg, parent_id: str):
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    return client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")


def parent_runs(cfg):
    return [r for r in stage_runs(cfg, "tune") if "mlflow.parentRunId" not in r.data.tags]


def read_rows(cfg) -> list[dict]:
    with (Path(cfg.paths.reports) / "tune_trials.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_search_records_every_trial_and_writes_the_best(digits_workdir):
    from tfmlops.stages import tune

    cfg = digits_workdir(**tune_params(), profiling={"enabled": True, "start_step": 2,
                                                      "steps": 2})
    metrics = tune.run(cfg)

    assert metrics["trials"] == metrics["trials_run"] == metrics["trials_completed"] == 3
    assert json.loads((Path(cfg.paths.reports) / "tune.json").read_text()) == metrics
    rows = read_rows(cfg)
    assert [r["trial"] for r in rows] == ["0", "1", "2"]
    assert {"score", "status", "learning_rate", "batch_size", "schedule"} <= set(rows[0])
    assert all(r["status"] == "COMPLETED" and float(r["score"]) > 0 for r in rows)
    assert all(1 <= int(r["best_epoch"]) <= int(r["epochs"]) for r in rows)  # 1-based, as train's
    # the tiny params' batch size 32 lies outside TINY_SPACE: no baseline trial
    assert [r["baseline"] for r in rows] == ["False"] * 3

    # MLflow: one parent, three children under it with distinct hyperparameters
    (parent,) = parent_runs(cfg)
    children = children_of(cfg, parent.info.run_id)
    assert sorted(c.info.run_name for c in children) == ["trial-0", "trial-1", "trial-2"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.params["learning_rate"] for c in children}) == 3
    assert all("val_accuracy" in c.data.metrics and "score" in c.data.metrics for c in children)
    client = mlflow_client(cfg)
    assert [m.step for m in client.get_metric_history(children[0].info.run_id, "val_loss")] == [0]
    assert parent.data.metrics["best_score"] == metrics["best_score"]
    assert parent.data.metrics["trials"] == 3
    assert parent.data.tags[TAG_TUNE_SEARCH] == search_key(cfg)
    artifacts = {a.path for folder in ("plots", "tune", "profile")
                 for a in client.list_artifacts(parent.info.run_id, folder)}
    assert {"plots/tune_score_per_trial.png", "plots/tune_score_vs_learning_rate.png",
            "tune/tune_trials.csv", "tune/best_hparams.yaml"} <= artifacts
    assert any(a.startswith("profile/") for a in artifacts)
    assert list(Path(cfg.paths.profiles, "tune").rglob("*.xplane.pb"))

    # the best file names the best trial, its values and the parent run
    best_row = max(rows, key=lambda r: float(r["score"]))
    assert metrics["best_trial"] == int(best_row["trial"])
    best_child = next(c for c in children if c.info.run_name == f"trial-{best_row['trial']}")
    assert parent.data.params["best.learning_rate"] == best_child.data.params["learning_rate"]
    tuned = hparams.read_best(cfg)
    assert tuned["train"]["optimizer"]["learning_rate"] == pytest.approx(
        float(best_row["learning_rate"]))
    assert len(tuned["model"]["blocks"]) == int(best_row["blocks"])
    assert tuned["model"]["blocks"][0]["filters"] == int(best_row["filters"])
    merged, _ = hparams.merge(cfg, tuned)  # what train builds from
    assert merged.model == search_space.config_from_values(cfg, {
        k: yaml.safe_load(best_row[k]) for k in search_space.HP_NAMES if best_row[k]}).model
    assert merged.train.batch_size == int(best_row["batch_size"])
    run_file = json.loads((Path(cfg.paths.tuned) / RUN_FILE).read_text())
    assert run_file["run_id"] == parent.info.run_id


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_first_trial_is_the_params_own_settings_once(digits_workdir, make_cfg, caplog):
    """Trial 0 runs the params' own settings (the baseline), tagged in MLflow and
    marked in the CSV; a resumed search does not run it again."""
    from tfmlops.stages import tune

    space = {**TINY_SPACE, "batch_size": [32, 64]}  # holds the tiny params' batch size
    caplog.set_level("INFO", logger="tfmlops")
    cfg = digits_workdir(**tune_params(max_trials=2, space=space))
    base = search_space.values_from_config(cfg)
    tune.run(cfg)
    rows = read_rows(cfg)
    assert [r["baseline"] for r in rows] == ["True", "False"]
    assert {k: yaml.safe_load(rows[0][k]) for k in search_space.HP_NAMES if rows[0][k]} == base
    (parent,) = parent_runs(cfg)
    tags = {c.info.run_name: c.data.tags["tfmlops.tune.baseline"]
            for c in children_of(cfg, parent.info.run_id)}
    assert tags == {"trial-0": "true", "trial-1": "false"}

    cfg = make_cfg(**tune_params(max_trials=3, space=space))  # resumed with a bigger budget
    again = tune.run(cfg)
    assert again["trials"] == 3 and again["trials_run"] == 1
    rows = read_rows(cfg)
    assert [r["baseline"] for r in rows] == ["True", "False", "False"]
    same_as_base = [r["trial"] for r in rows
                    if {k: yaml.safe_load(r[k]) for k in base} == base]
    assert same_as_base == ["0"]
    out = caplog.text
    assert out.count("trial 0 is the baseline") == 1 and "no baseline" not in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_final_round_trains_the_finalists_as_train_does_and_keeps_the_winner(digits_workdir):
    """The params' own settings and the search's best trial, each fit at
    train.epochs; best_hparams.yaml holds the winner (a tie keeps the params')."""
    from tfmlops.stages import tune

    cfg = digits_workdir(**tune_params(max_trials=2, final_candidates=1),
                         train={"epochs": 3, "early_stopping_patience": 0})
    metrics = tune.run(cfg)

    with (Path(cfg.paths.tuned) / FINAL_ROUND).open() as fh:
        final = list(csv.DictReader(fh))
    best_trial = str(metrics["best_trial"])
    assert [r["candidate"] for r in final] == ["params", f"trial-{best_trial}"]
    assert all(r["epochs"] == "3" and not r["error"] for r in final)
    params, challenger = final
    assert metrics["final_params_score"] == pytest.approx(float(params["score"]), abs=1e-6)
    beats = float(challenger["score"]) > float(params["score"])  # a tie keeps the params'
    assert metrics["final_winner_is_params"] == int(not beats)
    trial_row = next(r for r in read_rows(cfg) if r["trial"] == best_trial)
    winner_cfg = search_space.config_from_values(cfg, {
        k: yaml.safe_load(trial_row[k]) for k in search_space.HP_NAMES if trial_row[k]}) \
        if beats else cfg
    assert hparams.read_best(cfg) == hparams.tuned_tree(winner_cfg)

    (parent,) = parent_runs(cfg)
    finals = {c.info.run_name: c for c in children_of(cfg, parent.info.run_id)
              if c.data.tags.get("tfmlops.tune.round") == "final"}
    assert sorted(finals) == ["final-params", f"final-trial-{best_trial}"]
    client = mlflow_client(cfg)
    for child in finals.values():
        assert child.info.status == "FINISHED"
        history = client.get_metric_history(child.info.run_id, "val_loss")
        assert [m.step for m in history] == [0, 1, 2]  # train's length, not the search's
        lowest = 1 + min(range(3), key=lambda i: history[i].value)  # 1-based, as train.json's
        assert child.data.metrics["best_epoch"] == lowest
        row = next(r for r in final if child.info.run_name == f"final-{r['candidate']}")
        assert int(row["best_epoch"]) == lowest
    assert parent.data.tags["tfmlops.tune.winner"] == ("trial-" + best_trial if beats else "params")
    assert "tune/final_round.csv" in {a.path for a in client.list_artifacts(parent.info.run_id,
                                                                            "tune")}

    # The round trained the winner exactly as train then does: the same curve (train
    # fits afresh: by default it would adopt the round's fit).
    from tfmlops.stages import train

    trained = train.run(cfg, fresh=True)
    won = challenger if beats else params
    assert trained["best_val_loss"] == pytest.approx(float(won["val_loss"]), rel=1e-6)
    assert trained["best_val_accuracy"] == pytest.approx(float(won["score"]), rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_final_round_fails_an_oversized_params_model_and_the_challenger_wins(digits_workdir):
    """tune.max_model_params binds the params' own settings in the final round too."""
    from tfmlops.stages import tune

    small = {**TINY_SPACE, "blocks": {"min": 1, "max": 1}, "filters": [4], "head_units": [16]}
    # the tiny params' model (8 and 16 filters, head 32) is over 1,500 parameters;
    # every model of `small` is under it
    cfg = digits_workdir(**tune_params(max_trials=1, final_candidates=1, space=small,
                                       max_model_params=1500))
    metrics = tune.run(cfg)
    with (Path(cfg.paths.tuned) / FINAL_ROUND).open() as fh:
        params, challenger = list(csv.DictReader(fh))
    assert "Oversized model" in params["error"] and not params["score"]
    assert not challenger["error"] and metrics["final_winner_is_params"] == 0
    assert len(hparams.read_best(cfg)["model"]["blocks"]) == 1


@pytest.mark.slow
def test_no_final_round_when_train_does_not_use_the_tuned_settings(digits_workdir):
    from tfmlops.stages import tune

    cfg = digits_workdir(**tune_params(max_trials=1, final_candidates=1),
                         train={"use_tuned": False})
    metrics = tune.run(cfg)
    assert not any(k.startswith("final_") for k in metrics)
    assert not (Path(cfg.paths.tuned) / FINAL_ROUND).exists()
    # a speed-only setting does not make it a different search
    faster = replace(cfg, pipeline=replace(cfg.pipeline, autotune=True))
    assert search_key(faster) == search_key(cfg)


def test_best_hparams_merge_into_a_buildable_train_config(make_cfg):
    import keras

    from tfmlops.model.builder import build_model

    cfg = make_cfg()
    values = {"blocks": 2, "filters": 8, "separable": True, "batch_norm": False,
              "dropout": 0.1, "head_units": 16, "optimizer": "adamw", "learning_rate": 0.004,
              "schedule": "exponential_decay", "decay_rate": 0.5, "batch_size": 64}
    best = search_space.config_from_values(cfg, values)
    Path(cfg.paths.tuned).mkdir(parents=True)
    hparams.best_path(cfg).write_text(yaml.safe_dump(hparams.tuned_tree(best)))
    merged, _ = hparams.merge(cfg, hparams.read_best(cfg))
    assert merged.model == best.model
    assert merged.train.optimizer == best.train.optimizer
    assert merged.train.schedule == best.train.schedule
    assert build_model(merged.model, keras, (16, 16, 1), 10).count_params() > 0


def searches(cfg) -> list[Path]:
    """keras-tuner's project folders (beside them, on a CPU with bf16 units: precision.json)."""
    return [p for p in Path(cfg.paths.tuner).iterdir() if p.is_dir()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_runs_only_new_trials_and_a_new_space_starts_fresh(digits_workdir, make_cfg):
    from tfmlops.stages import tune

    cfg = digits_workdir(**tune_params(max_trials=2))
    first = tune.run(cfg)
    assert first["trials"] == first["trials_run"] == 2
    rows_before = read_rows(cfg)

    cfg = make_cfg(**tune_params(max_trials=3))  # a bigger budget: same search, resumed
    again = tune.run(cfg)
    assert again["trials"] == 3 and again["trials_run"] == 1
    rows = read_rows(cfg)
    assert rows[:2] == rows_before  # finished trials are kept, not rerun
    newest = max(parent_runs(cfg), key=lambda r: r.info.start_time)
    assert [c.info.run_name for c in children_of(cfg, newest.info.run_id)] == ["trial-2"]
    assert len(searches(cfg)) == 1

    space = {**TINY_SPACE, "head_units": [8]}  # a changed space: a fresh search
    cfg = make_cfg(**tune_params(max_trials=1, space=space))
    fresh = tune.run(cfg)
    assert fresh["trials"] == fresh["trials_run"] == 1
    assert len(searches(cfg)) == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_search_killed_after_a_trial_resumes_to_the_cold_searchs_choice(
        digits_workdir, make_cfg, prepared_digits, tmp_path):
    """docs/stages.md: the search state survives a kill, rerunning resumes it. `tfmlops tune`
    SIGKILLed as its second trial ends (no finally block runs), then run again: it runs
    only the third trial and chooses what an uninterrupted search in another folder does."""
    import shutil
    import signal
    import subprocess

    from conftest import VENV_BIN, child_env

    cfg = digits_workdir(**tune_params())
    killed = subprocess.run([str(VENV_BIN / "tfmlops"), "tune"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=400,
                            env={**child_env(), "TFMLOPS_FAULT": "tune.trial_end@2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = json.loads(run_cli("tune", cwd=tmp_path).stdout.splitlines()[-1])
    assert resumed["trials"] == 3 and resumed["trials_run"] == 1, resumed

    cold_dir = tmp_path / "cold"
    shutil.copytree(prepared_digits.paths.prepared, cold_dir / "data" / "prepared")
    cold_cfg = make_cfg(cold_dir, **tune_params())
    cold = json.loads(run_cli("tune", cwd=cold_dir).stdout.splitlines()[-1])
    assert cold["trials_run"] == 3
    assert (resumed["best_trial"], resumed["best_score"]) == (cold["best_trial"], cold["best_score"])
    assert hparams.read_best(cfg) == hparams.read_best(cold_cfg)
    keys = ("trial", "status", "score", "learning_rate", "batch_size", "blocks", "filters")
    assert [{k: r[k] for k in keys} for r in read_rows(cfg)] == \
        [{k: r[k] for k in keys} for r in read_rows(cold_cfg)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_search_whose_saved_state_is_torn_starts_afresh_with_one_line(digits_workdir, caplog):
    """keras-tuner rewrites oracle.json and trial.json in place, without fsync: one torn by
    a kill or a power cut failed every later `tune` in Oracle.reload (JSONDecodeError).
    The damaged search is discarded with one warning line and runs afresh (issue 47, L5)."""
    from tfmlops.stages import tune
    from tfmlops.stages.tune.search import adopt_search, torn_json

    cfg = digits_workdir(**tune_params(max_trials=1), tracking={"enabled": False})
    assert tune.run(cfg)["trials_run"] == 1
    (project,) = searches(cfg)
    oracle, trial = project / "oracle.json", project / "trial_0" / "trial.json"
    assert json.loads(oracle.read_text()) and json.loads(trial.read_text())
    for torn in (oracle, trial):  # each of keras-tuner's files, cut where a kill would
        whole = torn.read_bytes()
        torn.write_bytes(whole[: len(whole) // 2])
        assert torn_json(project).startswith(str(torn.relative_to(project)) + ": ")
        if torn is oracle:
            torn.write_bytes(whole)
    caplog.set_level("INFO", logger="tfmlops")
    again = tune.run(cfg)
    assert again["trials"] == again["trials_run"] == 1  # afresh: the torn trial is not kept
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "trial_0/trial.json: " in warning and "discarded" in warning and "\n" not in warning
    assert searches(cfg) == [project] and torn_json(project) is None
    # A damaged folder that is not marked as tfmlops' own is refused, not deleted.
    (project / MARKER).unlink()
    oracle.write_bytes(b"{")
    with pytest.raises(DataError, match="remove it to start the search afresh"):
        adopt_search(cfg, search_key(cfg))
    assert oracle.read_bytes() == b"{"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hyperband_continues_trials_and_a_failed_trial_is_recorded(digits_workdir):
    """Hyperband's second round loads an earlier trial's weights; a trial over
    max_model_params fails, is recorded FAILED, and the search goes on."""
    from tfmlops.stages import tune

    # Exactly two architectures (4 or 32 filters): with max_model_params between
    # their sizes one of the two first-round trials must fail.
    space = {**TINY_SPACE, "blocks": {"min": 1, "max": 1}, "filters": [4, 32],
             "separable": [False], "head_units": [16], "batch_norm": [False],
             "optimizer": ["adam"], "schedule": ["constant"]}
    cfg = digits_workdir(tune={"tuner": "hyperband", "max_epochs": 2, "hyperband_factor": 2,
                               "max_trials": 3, "max_model_params": 1000, "space": space,
                               "final_candidates": 0})
    metrics = tune.run(cfg)
    rows = read_rows(cfg)
    assert [r["status"] for r in rows].count("FAILED") >= 1
    assert metrics["trials_failed"] >= 1 and metrics["trials_completed"] >= 1
    assert all(r["filters"] == "32" for r in rows if r["status"] == "FAILED")
    # the round-2 trial trains epoch 2 on top of round 1's weights
    continued = [r for r in rows if r["epochs"] == "2"]
    assert continued and continued[0]["status"] == "COMPLETED"

    (parent,) = parent_runs(cfg)
    statuses = {c.info.run_name: c.info.status for c in children_of(cfg, parent.info.run_id)}
    failed = [f"trial-{r['trial']}" for r in rows if r["status"] == "FAILED"]
    assert all(statuses[name] == "FAILED" for name in failed)
    assert list(statuses.values()).count("FINISHED") == metrics["trials_completed"]
    child = next(c for c in children_of(cfg, parent.info.run_id) if c.info.run_name == failed[0])
    assert "Oversized model" in child.data.tags["tfmlops.tune.error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wall_clock_budget_stops_cleanly_and_keeps_the_best(digits_workdir):
    from tfmlops.stages import tune

    cfg = digits_workdir(**tune_params(max_trials=5, max_epochs=3, budget_minutes=0.001))
    metrics = tune.run(cfg)
    assert metrics["budget_exhausted"] == 1
    assert metrics["trials"] == 1  # at least one trial always finishes
    (row,) = read_rows(cfg)
    assert row["status"] == "COMPLETED"
    assert hparams.best_path(cfg).is_file()


def test_disabled_writes_the_params_own_settings(make_cfg):
    from tfmlops.stages import tune

    cfg = make_cfg(tune={"enabled": False})
    metrics = tune.run(cfg)
    assert metrics["trials"] == 0
    assert hparams.read_best(cfg) == hparams.tuned_tree(cfg)
    assert read_rows(cfg) == []
    # every declared output exists (dvc.yaml lists paths.tuner), and holds no search state
    assert Path(cfg.paths.tuner).is_dir() and not any(Path(cfg.paths.tuner).iterdir())
    (parent,) = parent_runs(cfg)
    assert parent.data.tags["tfmlops.tune.enabled"] == "false"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_disabled_passes_dvc_repro_and_keeps_a_previous_search(tmp_path):
    # issue 14.1: DVC checks every declared output (paths.tuner too) after the stage ran
    repo = scratch_repo(tmp_path / "repo", relative_tiny_params(tune={"enabled": False}))
    first = dvc("repro", "tune", cwd=repo, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Running stage 'tune'" in first.stdout
    assert (repo / "models" / "tuned" / BEST_HPARAMS).is_file()
    assert "tune" in yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    again = dvc("repro", "tune", cwd=repo)
    assert "Running stage" not in again.stdout
    # a search of an earlier run persists, so re-enabling tune resumes it
    state = repo / "data" / "tuner" / "random-old" / "oracle.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    dvc("repro", "-f", "tune", cwd=repo)
    assert state.read_text() == "{}"


@pytest.mark.parametrize("tune, key", [
    ({"space": {"dropout": {"min": 0.3, "max": 0.1}}}, "tune.space.dropout"),
    ({"space": {"learning_rate": {"min": 0.01, "max": 0.001}}}, "tune.space.learning_rate"),
    ({"space": {"filters": []}}, "tune.space.filters"),
    ({"space": {"schedule": ["constant", "step_decay"]}}, "tune.space.schedule"),
    ({"space": {"optimizer": ["adam", "adagrad"]}}, "tune.space.optimizer"),
    ({"tuner": "grid"}, "tune.tuner"),
    ({"max_trials": 0}, "tune.max_trials"),
    ({"space": {"blocks": {"min": 1, "max": 9}}}, "tune.space.blocks.max"),
])
def test_invalid_search_space_exits_2_with_one_line(tmp_path, tune, key):
    # written as is: the loader in the CLI is what must reject it
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path, tune=tune)))
    proc = run_cli("tune", cwd=tmp_path, check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"tfmlops tune: error: {key}:"), lines
    assert not (tmp_path / "models").exists()  # failed before any work
