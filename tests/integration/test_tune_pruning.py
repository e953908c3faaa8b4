"""tune.pruning on real keras-tuner searches of tiny digits: a losing trial stops, is recorded,
two cold searches stop the same trials and choose the same configuration, and a search
killed mid-way resumes to the cold search's choice (the pruner's state survives the kill)."""

from __future__ import annotations

import json
import shutil

import pytest
from test_tune import TINY_SPACE, children_of, parent_runs, read_rows, tune_params

from conftest import mlflow_client, run_cli
from tfmlops.model import hparams

# Judged from the first epoch against any one earlier trial, so that a 4-trial search of
# 3 epochs stops some; learning rates down to 1e-4, which learn little in an epoch, make
# losing trials certain. No keras EarlyStopping: only the pruner stops a trial here.
PRUNING = {"rule": "median", "warmup_epochs": 0, "min_trials": 1}
SPACE = {**TINY_SPACE, "learning_rate": {"min": 0.0001, "max": 0.01}}
COMPARED = ("trial", "status", "score", "stopped_at_epoch", "best_epoch", "learning_rate",
            "batch_size", "blocks", "filters", "schedule")


def pruned_params(**tune):
    return tune_params(**{"max_trials": 4, "max_epochs": 3, "early_stopping_patience": 0,
                          "space": SPACE, "pruning": PRUNING, **tune})


def compared(rows):
    return [{k: r[k] for k in COMPARED} for r in rows]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_losing_trial_stops_is_recorded_and_a_second_cold_search_chooses_the_same(
        digits_workdir, make_cfg, prepared_digits, tmp_path):
    from tfmlops.stages import tune

    cfg = digits_workdir(**pruned_params())
    metrics = tune.run(cfg)
    rows = read_rows(cfg)
    stopped = [r for r in rows if r["stopped_at_epoch"]]
    assert stopped and metrics["trials_pruned"] == len(stopped), rows
    assert all(r["status"] == "COMPLETED" and 1 <= int(r["stopped_at_epoch"]) < 3 for r in stopped)
    ran_out = [r for r in rows if not r["stopped_at_epoch"]]
    # a stopped trial trails a trial that finished: never the search's best
    assert str(metrics["best_trial"]) in {r["trial"] for r in ran_out}

    (parent,) = parent_runs(cfg)
    client = mlflow_client(cfg)
    children = {c.info.run_name: c for c in children_of(cfg, parent.info.run_id)}
    for row in rows:
        child = children[f"trial-{row['trial']}"]
        curve = [m.value for m in client.get_metric_history(child.info.run_id, "val_accuracy")]
        epochs = int(row["stopped_at_epoch"] or 3)
        assert len(curve) == epochs  # a stopped trial trained no further
        # the score the oracle got is the best it reached before the stop
        assert float(row["score"]) == pytest.approx(max(curve))
        if row["stopped_at_epoch"]:
            assert child.data.metrics["stopped_at_epoch"] == epochs
            assert child.data.tags["tfmlops.tune.stopped_at_epoch"] == row["stopped_at_epoch"]
        else:
            assert "stopped_at_epoch" not in child.data.metrics

    # the same search, cold, in another folder: the same trials stop, the same choice
    again_dir = tmp_path / "again"
    shutil.copytree(prepared_digits.paths.prepared, again_dir / "data" / "prepared")
    again_cfg = make_cfg(again_dir, **pruned_params())
    again = tune.run(again_cfg)
    assert compared(read_rows(again_cfg)) == compared(rows)
    assert (again["best_trial"], again["best_score"]) == (metrics["best_trial"],
                                                         metrics["best_score"])
    assert hparams.read_best(again_cfg) == hparams.read_best(cfg)

    # the same search unpruned: every trial that ran to its end scored as it does there, so
    # stopping the losers changed no other trial (each trial draws its own batches)
    off_dir = tmp_path / "off"
    shutil.copytree(prepared_digits.paths.prepared, off_dir / "data" / "prepared")
    off_cfg = make_cfg(off_dir, **pruned_params(pruning={**PRUNING, "rule": "off"}))
    tune.run(off_cfg)
    off_rows = read_rows(off_cfg)
    assert [(r["trial"], r["learning_rate"]) for r in off_rows] == \
        [(r["trial"], r["learning_rate"]) for r in rows]
    assert [(r["trial"], r["score"]) for r in ran_out] == \
        [(r["trial"], r["score"]) for r in off_rows if r["trial"] in {x["trial"] for x in ran_out}]
    assert any(int(r["trial"]) > int(stopped[0]["trial"]) for r in ran_out), rows  # one after


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("rule", ["median", "halving"])
def test_a_pruned_search_killed_after_a_trial_resumes_to_the_cold_searchs_choice(
        digits_workdir, make_cfg, prepared_digits, tmp_path, rule):
    """SIGKILLed as its second trial ends, then rerun: the third and fourth trials are judged
    against the first two's curves, read back from the pruner's state file, as in a cold
    search (without that state they would run to their end). Under both rules: halving
    judges at its rung (after epoch 1 here) against the earlier trials' ranking there."""
    import signal
    import subprocess

    from conftest import VENV_BIN, child_env

    params = pruned_params(pruning={**PRUNING, "rule": rule})
    cfg = digits_workdir(**params, tracking={"enabled": False})
    killed = subprocess.run([str(VENV_BIN / "tfmlops"), "tune"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=400,
                            env={**child_env(), "TFMLOPS_FAULT": "tune.trial_end@2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = json.loads(run_cli("tune", cwd=tmp_path).stdout.splitlines()[-1])
    assert resumed["trials"] == 4 and resumed["trials_run"] == 2, resumed

    cold_dir = tmp_path / "cold"
    shutil.copytree(prepared_digits.paths.prepared, cold_dir / "data" / "prepared")
    cold_cfg = make_cfg(cold_dir, **params, tracking={"enabled": False})
    cold = json.loads(run_cli("tune", cwd=cold_dir).stdout.splitlines()[-1])
    rows = read_rows(cold_cfg)
    # the resumed trials (2 and 3) include a stopped one: the state mattered
    assert any(r["stopped_at_epoch"] for r in rows[2:]), rows
    assert compared(read_rows(cfg)) == compared(rows)
    assert (resumed["best_trial"], resumed["best_score"], resumed["trials_pruned"]) == \
        (cold["best_trial"], cold["best_score"], cold["trials_pruned"])
    assert hparams.read_best(cfg) == hparams.read_best(cold_cfg)
