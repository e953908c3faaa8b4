"""`tfmlops tune` in keras-tuner's distributed mode: a chief oracle and two workers.

Real processes on 127.0.0.1 (KERASTUNER_TUNER_ID / _ORACLE_IP / _ORACLE_PORT),
one shared workdir, MLflow on a temp SQLite store.
"""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, child_env, free_port, mlflow_client
from tfmlops.artifacts import BEST_HPARAMS, TAG_STAGE, TAG_TUNE_SEARCH
from tfmlops.stages.tune.search import search_key

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


TRIALS = 4
SPACE = {  # tiny models, every value valid at 16x16
    "blocks": {"min": 1, "max": 2, "step": 1},
    "filters": [4, 8],
    "separable": [False],
    "batch_norm": [True, False],
    "dropout": {"min": 0.0, "max": 0.2},
    "head_units": [16],
    "optimizer": ["adam"],
    "learning_rate": {"min": 0.001, "max": 0.01},
    "schedule": ["constant"],
    "batch_size": [64],
}
TUNER_IDS = ("tuner0", "tuner1")


def tune_runs(cfg) -> list:
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    return client.search_runs([exp.experiment_id], "", max_results=1000)


@pytest.mark.timeout(900)
def test_a_chief_and_two_workers_split_the_trials_under_one_parent_run(digits_workdir,
                                                                         tmp_path):
    from tfmlops.model import hparams

    cfg = digits_workdir(tune={"tuner": "random", "max_trials": TRIALS, "max_epochs": 1,
                               "budget_minutes": 30.0, "space": SPACE})
    base = {**child_env(), "KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1"}
    logs = {name: tmp_path / f"{name}.log" for name in ("chief", *TUNER_IDS)}
    procs = {}
    try:
        # All at once: the chief's budget clock starts with it, workers wait for its oracle.
        for name, log in logs.items():
            with log.open("w") as out:  # a file, not a pipe: a full pipe would block it
                procs[name] = subprocess.Popen(
                    [str(VENV_BIN / "tfmlops"), "tune"], cwd=tmp_path,
                    env={**base, "KERASTUNER_TUNER_ID": name}, stdout=out,
                    stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 840  # generous: a loaded machine runs at half speed
        for proc in procs.values():
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = {name: log.read_text() for name, log in logs.items()}
    tails = "\n".join(f"--- {name}:\n{text[-3000:]}" for name, text in output.items())
    assert {name: p.returncode for name, p in procs.items()} == dict.fromkeys(logs, 0), tails

    # The trials went through the oracle: both workers served it, together they ran every
    # trial once. How many each got depends on when its TensorFlow import finished (a worker
    # late by one trial's length on a loaded machine may get none): not asserted.
    ran = {name: json.loads(output[name].strip().splitlines()[-1]) for name in TUNER_IDS}
    assert all(r["role"] == "worker" for r in ran.values()), ran
    assert sum(r["trials_run"] for r in ran.values()) == TRIALS

    # MLflow: one parent run of the search, each trial exactly once as its child.
    runs = tune_runs(cfg)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.tags[TAG_STAGE] == "tune"
    assert parent.data.tags[TAG_TUNE_SEARCH] == search_key(cfg)
    assert parent.info.status == "FINISHED"
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(nested) == len(runs) - 1  # nothing outside the parent
    # The chief's final round after the search: the params' settings and the best trial.
    finals = [r for r in nested if r.data.tags.get("tfmlops.tune.round") == "final"]
    assert sorted(r.info.run_name for r in finals) == \
        ["final-params", f"final-trial-{parent.data.tags['tfmlops.tune.best_trial']}"]
    children = [r for r in nested if r not in finals]
    assert sorted(c.data.tags["tfmlops.tune.trial"] for c in children) == \
        [str(i) for i in range(TRIALS)]
    assert all(c.info.status == "FINISHED" and "score" in c.data.metrics for c in children)
    by_tuner = {t: sum(c.data.tags["tfmlops.tune.tuner_id"] == t for c in children)
                for t in TUNER_IDS}
    assert by_tuner == {t: ran[t]["trials_run"] for t in TUNER_IDS}

    # The outputs, written once by the chief.
    written = [p for p in tmp_path.rglob(BEST_HPARAMS) if "mlartifacts" not in p.parts]
    assert written == [hparams.best_path(cfg)]
    logged = [a.path for a in mlflow_client(cfg).list_artifacts(parent.info.run_id, "tune")]
    assert logged.count(f"tune/{BEST_HPARAMS}") == 1
    assert "tune: best" in output["chief"]
    assert all("tune: best" not in output[t] for t in TUNER_IDS)
    metrics = json.loads((Path(cfg.paths.reports) / "tune.json").read_text())
    assert metrics["trials"] == metrics["trials_completed"] == metrics["trials_run"] == TRIALS
    assert parent.data.metrics["best_score"] == metrics["best_score"]
    with (Path(cfg.paths.reports) / "tune_trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["trial"] for r in rows] == [str(i) for i in range(TRIALS)]
    assert all(r["seconds"] for r in rows)  # the workers' side files reached the chief
    hparams.read_best(cfg)  # the file honours the contract train reads
