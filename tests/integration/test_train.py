"""The train stage end to end on tiny real digits: outputs, MLflow, determinism, faults."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import VENV_BIN, child_env, host_gpus, mlflow_client, run_cli, stage_runs
from tfmlops.artifacts import (
    BEST_HPARAMS,
    MODEL_FILE,
    PRECISION,
    RESOLVED_PARAMS,
    RUN_FILE,
    SEARCHED,
    TUNE_MERGE,
    data_version,
)
from tfmlops.errors import ConfigError, DataError
from tfmlops.model.fitting import BEST_WEIGHTS

NO_TUNE = {"use_tuned": False}
QUIET = {"tracking": {"enabled": False}}


def history(cfg) -> list[dict]:
    with open(Path(cfg.paths.reports) / "train_history.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def report(cfg) -> dict:
    return json.loads((Path(cfg.paths.reports) / "train.json").read_text())


def write_best(cfg, **model_changes) -> None:
    """A search result as tune leaves it: best_hparams.yaml and the params it read."""
    from tfmlops.model import hparams

    tree = hparams.tuned_tree(cfg)
    tree["model"].update(model_changes)
    path = hparams.best_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree))
    hparams.write_searched(cfg, path.parent, data_version(cfg.paths.prepared))


def artifact_paths(client, run_id: str, folder: str = "") -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, folder or None):
        found.extend(artifact_paths(client, run_id, item.path) if item.is_dir else [item.path])
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_writes_outputs_and_a_complete_mlflow_run(digits_workdir):
    from tfmlops import tracking
    from tfmlops.model.fitting import HISTORY_COLUMNS
    from tfmlops.model.trained import load_keras3, trained_config, trained_model_path
    from tfmlops.stages import train

    cfg = digits_workdir(train={"overrides": {"optimizer.learning_rate": 0.003}},
                         profiling={"enabled": True, "start_step": 2, "steps": 2})
    with tracking.stage_run(cfg, "tune", cfg.paths.tuned) as tune_run:  # tune's real run
        write_best(cfg, dropout=0.2, head_units=24)

    metrics = train.run(cfg)

    folder = Path(cfg.paths.train)
    for name in (MODEL_FILE, RESOLVED_PARAMS, RUN_FILE, TUNE_MERGE,
                 PRECISION, "classification_report.json", "confusion_matrix.png",
                 "training_curves.png"):
        assert (folder / name).is_file(), name
    assert report(cfg) == json.loads(json.dumps(metrics))
    assert metrics["epochs_run"] == 2
    assert metrics["global_batch_size"] == 32 * metrics["replicas"]
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["test_loss"] > 0
    assert metrics["wall_seconds"] > 0 and metrics["images_per_s"] > 0
    assert metrics["profile_step_ms"] > 0 and 0 <= metrics["profile_input_wait_share"] <= 1
    rows = history(cfg)
    assert list(rows[0]) == list(HISTORY_COLUMNS)
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(float(r["learning_rate"]) > 0 and float(r["images_per_s"]) > 0 for r in rows)
    assert list(Path(cfg.paths.backup).iterdir()) == []  # emptied after success

    # The merge: tune's values, then the explicit override, recorded as changes.
    trained = trained_config(cfg)
    assert (trained.model.dropout, trained.model.head_units) == (0.2, 24)
    assert trained.train.optimizer.learning_rate == 0.003
    changes = {c["key"]: c for c in json.loads((folder / TUNE_MERGE).read_text())}
    assert changes["model.dropout"]["source"] == "tune"
    assert changes["train.optimizer.learning_rate"]["source"] == "override"

    # The saved model is the evaluated one (best weights), loadable with safe_mode.
    from tfmlops.data import pipeline

    model = load_keras3(trained_model_path(cfg))
    assert model.get_layer("head_dense").units == 24
    x_test, y_test = pipeline.arrays(cfg, pipeline.load_prepared(cfg), "test")
    local = model.predict(x_test, verbose=0)
    assert np.isclose((local.argmax(-1) == y_test).mean(), metrics["test_accuracy"], atol=1e-6)

    # MLflow: params, per-epoch metrics, lineage, profiler artifacts, a loadable model.
    client = mlflow_client(cfg)
    (run,) = stage_runs(cfg, "train")
    assert json.loads((folder / RUN_FILE).read_text())["run_id"] == run.info.run_id
    params = run.data.params
    from tfmlops.model import precision
    from tfmlops.stages.train.strategy import resolve_strategy

    # auto: what this host's GPUs and CPU flags decide for this architecture, never timed
    expected = precision.choose_policy("auto", precision.gpu_capabilities(), precision.cpu_flags(),
                                spec=trained.model)
    assert params["resolved.precision_policy"] == expected.policy
    assert params["resolved.precision_reason"] == expected.reason != "timed"
    assert not any(k.startswith("precision_") for k in run.data.metrics)
    assert json.loads((folder / PRECISION).read_text())["policy"] == expected.policy
    strategy = resolve_strategy("auto", None, host_gpus())
    replicas = max(host_gpus(), 1) if strategy == "mirrored" else 1
    assert params["resolved.global_batch_size"] == str(32 * replicas)
    assert params["resolved.replicas"] == str(replicas)
    assert params["resolved.strategy"] == strategy
    assert params["model.head_units"] == "24"
    assert params["tune_merge.model.dropout"].endswith("-> 0.2 (tune)")
    assert run.data.tags["tfmlops.upstream.tune"] == tune_run.run_id
    assert run.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    for key in ("loss", "val_accuracy", "learning_rate", "epoch_seconds", "images_per_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    artifacts = artifact_paths(client, run.info.run_id)
    assert any(p.startswith("profile/") and p.endswith(".xplane.pb") for p in artifacts)
    for name in ("train/confusion_matrix.png", "train/resolved_params.yaml",
                 "train/classification_report.json", "reports/train_history.csv",
                 "reports/label_issues.csv", "reports/label_issues.png"):
        assert name in artifacts  # what `results.finish` made, logged by the harness

    import mlflow

    uri = f"runs:/{run.info.run_id}/model"
    assert mlflow.models.get_model_info(uri).signature is not None
    logged = mlflow.tensorflow.load_model(uri)
    np.testing.assert_allclose(logged.predict(x_test[:8], verbose=0), local[:8], atol=1e-6)


def _stopped_after_its_last_backup(cfg, monkeypatch) -> None:
    """`train` stopped by SIGTERM once every epoch is backed up, before it saves its model
    (the fault point `train.fitted`; a kill there leaves a backup with nothing left to
    train). A thread polling the backup raced train's end: under load train finished first."""
    from tfmlops import faults, harness
    from tfmlops.model.backup import finished_epochs
    from tfmlops.stages import train

    faults._visits.pop("train.fitted", None)
    with monkeypatch.context() as m:
        m.setenv("TFMLOPS_FAULT", "train.fitted")
        m.setenv("TFMLOPS_FAULT_SIGNAL", "SIGTERM")
        # Terminated, not this process's end
        with harness.terminated_on_sigterm(), pytest.raises(harness.Terminated):
            train.run(cfg)
    backup = Path(cfg.paths.backup)
    assert finished_epochs(backup) == cfg.train.epochs and (backup / BEST_WEIGHTS).is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_runs_with_the_same_params_give_bit_identical_weights(
        digits_workdir, make_cfg, prepared_digits, tmp_path, caplog, monkeypatch):
    from tfmlops.model.trained import load_keras3, trained_model_path
    from tfmlops.stages import train

    sections = {"train": NO_TUNE, **QUIET}
    first = digits_workdir(**sections)
    twin_dir = tmp_path / "twin"
    shutil.copytree(prepared_digits.paths.prepared, twin_dir / "data" / "prepared")
    second = make_cfg(workdir=twin_dir, **sections)
    # A killed run's backup made with other params must not be resumed (its
    # weights file is garbage: loading it would fail, resuming would differ).
    stale = Path(first.paths.backup)
    stale.mkdir(parents=True)
    (stale / "latest.weights.h5").write_bytes(b"not weights")
    (stale / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    (stale / "fingerprint.json").write_text('{"params": "other", "data": "other"}')

    caplog.set_level("INFO", logger="tfmlops")
    _stopped_after_its_last_backup(first, monkeypatch)
    assert "discarded the backup" in caplog.text
    # Keras' ModelCheckpoint rewrites best.weights.h5 in place, without fsync: torn by a
    # kill or a power cut, it was resumed with nothing left to train and failed the run at
    # its end, loading it. Discarded on adoption instead, in one warning line; the run then
    # starts afresh, as its twin does (issue 47, L5).
    best = stale / BEST_WEIGHTS
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    caplog.clear()
    assert train.run(first)["resumed_after_epoch"] == 0
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{BEST_WEIGHTS}: " in warning and "discarded" in warning and "\n" not in warning
    assert list(stale.iterdir()) == []
    train.run(second)

    a = load_keras3(trained_model_path(first)).get_weights()
    b = load_keras3(trained_model_path(second)).get_weights()
    assert len(a) == len(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert [r["val_loss"] for r in history(first)] == [r["val_loss"] for r in history(second)]


def test_classification_report_counts_per_class():
    from tfmlops.stages.train.results import classification_report

    report = classification_report([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], ["a", "b", "c"])
    assert report["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert report["per_class"]["a"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert report["per_class"]["b"]["precision"] == pytest.approx(2 / 3, abs=1e-6)
    assert report["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert report["accuracy"] == pytest.approx(0.6)


@pytest.mark.parametrize("case, sections, error, message", [
    ("missing prepared data", {"train": NO_TUNE}, DataError, "dvc repro prepare"),
    ("stale prepared data", {"train": NO_TUNE, "data": {"image_size": 24}}, DataError, "stale"),
    ("unbuildable spec", {"train": NO_TUNE,
                          "model": {"blocks": [{"filters": 4, "kernel_size": 3}] * 6}},
     ConfigError, "model.blocks"),
    ("batch larger than the data", {"train": {**NO_TUNE, "batch_size": 4096}}, DataError,
     "train.batch_size"),
    ("tune output missing", {"train": {"use_tuned": True}}, DataError, "dvc repro tune"),
])
def test_bad_input_fails_before_any_work(case, sections, error, message, digits_workdir,
                                         make_cfg):
    from tfmlops.stages import train

    cfg = make_cfg(**sections) if case == "missing prepared data" else digits_workdir(**sections)
    with pytest.raises(error, match=message):
        train.run(cfg)
    assert not Path(cfg.paths.train).exists()
    assert stage_runs(cfg, "train") == []


def test_a_stale_search_is_refused_naming_what_changed(make_cfg, tmp_path):
    """docs/stages.md's case: model.backbone set after the search; `tfmlops train` alone must
    not train the searched plain CNN (best_hparams.yaml holds backbone: none)."""
    from tfmlops.stages import tune

    tune.run(make_cfg(data={"image_size": 32}, tune={"enabled": False}, **QUIET))
    make_cfg(data={"image_size": 32}, model={"backbone": "mobilenet_v3_small"},
             tune={"enabled": False}, **QUIET)
    proc = run_cli("train", cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "best_hparams.yaml is stale" in line and "run `dvc repro tune`" in line
    assert "model.backbone ('none' -> 'mobilenet_v3_small')" in line
    assert "changed since the search: model.backbone ('none' -> 'mobilenet_v3_small'); run" in line
    assert not (tmp_path / "models" / "train").exists()


def test_the_search_record_tells_inputs_from_guards(make_cfg):
    from tfmlops.model import hparams
    from tfmlops.stages import tune

    cfg = make_cfg(tune={"enabled": False}, **QUIET)
    tune.run(cfg)
    hparams.check_fresh(cfg, "none")  # unchanged: accepted
    # a guard and how train places the run are not inputs of the search's result
    hparams.check_fresh(make_cfg(tune={"enabled": False, "budget_minutes": 99.0},
                                 train={"replicas": 2, "use_tuned": False}, **QUIET), "none")
    for sections, key in [({"seed": 7}, "seed"),
                          ({"train": {"epochs": 3}}, "train.epochs"),
                          ({"tune": {"enabled": True}}, "tune.enabled"),
                          ({"model": {"blocks": [{"filters": 4, "kernel_size": 3}]}},
                           "model.blocks.0.filters"),
                          ({"pipeline": {"shuffle_buffer": 16}}, "pipeline.shuffle_buffer")]:
        sections = {"tune": {"enabled": False}, **sections} if "tune" not in sections else sections
        with pytest.raises(DataError, match=rf"stale: changed since the search: {key} "):
            hparams.check_fresh(make_cfg(**sections, **QUIET), "none")
    with pytest.raises(DataError, match=r"prepared data \(version\) \('none' -> 'abc'\)"):
        hparams.check_fresh(cfg, "abc")  # prepared again since the search
    (Path(cfg.paths.tuned) / SEARCHED).unlink()
    with pytest.raises(DataError, match="no readable record.*dvc repro tune"):
        hparams.check_fresh(cfg, "none")


def test_cli_reports_a_missing_tune_output_in_one_line(make_cfg, tmp_path):
    make_cfg(train={"use_tuned": True})
    proc = run_cli("train", cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert BEST_HPARAMS in line and "dvc repro tune" in line


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mirrored_on_two_logical_cpus_with_bfloat16(digits_workdir, tmp_path):
    from tfmlops.model.trained import load_keras3, trained_model_path

    cfg = digits_workdir(train={**NO_TUNE, "epochs": 1, "strategy": "mirrored", "replicas": 2,
                                "precision": "mixed_bfloat16"}, **QUIET)
    run_cli("train", cwd=tmp_path)
    metrics = report(cfg)
    assert metrics["replicas"] == 2
    assert metrics["global_batch_size"] == 2 * cfg.train.batch_size
    assert len(history(cfg)) == 1
    model = load_keras3(trained_model_path(cfg))
    assert model.get_layer("block0_conv0").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("probabilities").dtype_policy.compute_dtype == "float32"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_run_killed_after_an_epoch_resumes_from_its_backup(digits_workdir, tmp_path):
    from tfmlops.model.backup import finished_epochs

    epochs = 6
    cfg = digits_workdir(train={**NO_TUNE, "epochs": epochs}, **QUIET)
    backup = Path(cfg.paths.backup)
    env = {**child_env()}
    proc = subprocess.Popen([str(VENV_BIN / "tfmlops"), "train"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while finished_epochs(backup) < 1:
            assert proc.poll() is None, "train ended before its first backup"
            assert time.monotonic() < deadline, "no backup after 240 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed_after = finished_epochs(backup)
    assert 1 <= killed_after < epochs
    assert not Path(cfg.paths.train).exists()  # nothing half-written, nothing "done"
    assert not (Path(cfg.paths.reports) / "train.json").exists()

    resumed = run_cli("train", cwd=tmp_path)
    assert f"resuming after epoch {killed_after} of {epochs}" in resumed.stderr
    assert [int(r["epoch"]) for r in history(cfg)] == list(range(1, epochs + 1))
    metrics = report(cfg)
    assert metrics["resumed_after_epoch"] == killed_after
    assert metrics["epochs_run"] == epochs
    assert list(backup.iterdir()) == []

