"""The prepare stage on messy real images, tracked in a real MLflow store."""

import json
import re
from pathlib import Path

import pytest

from conftest import mlflow_client, stage_runs
from images import mixed_folder
from tfmlops import profiling
from tfmlops.errors import DataError
from tfmlops.stages import prepare


def test_mixed_folder_with_broken_files(tmp_path, make_cfg):
    expected_bad = mixed_folder(tmp_path / "own")
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "channels": 3,
                         "max_bad_fraction": 0.2, "split": {"val": 0.2, "test": 0.2}})
    metrics = prepare.run(cfg)
    assert metrics["images_bad"] == len(expected_bad) == 5
    assert metrics["images_good"] == 36
    assert metrics["train_images"] + metrics["val_images"] + metrics["test_images"] == 36

    out = Path(cfg.paths.prepared)
    quarantine = json.loads((out / "quarantine.json").read_text())
    assert {q["file"] for q in quarantine} == set(expected_bad)
    for q in quarantine:  # a copy sits beside the report; the user's folder is untouched
        assert (out / "quarantine" / q["file"]).exists() and (tmp_path / "own" / q["file"]).exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["channels"] == 3 and manifest["classes"] == ["0", "1", "2"]
    stats = json.loads((out / "stats.json").read_text())
    assert len(stats["mean"]) == len(stats["std"]) == 3
    assert json.loads((Path(cfg.paths.reports) / "prepare.json").read_text()) == metrics


def test_run_holds_params_metrics_tags_and_dataset_input(tmp_path, make_cfg):
    mixed_folder(tmp_path / "own", per_class=10)
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.25,
                         "split": {"val": 0.2, "test": 0.2}},
                   profiling={"enabled": True, "start_step": 1, "steps": 1})
    prepare.run(cfg)
    (run,) = stage_runs(cfg, "prepare")
    assert run.info.status == "FINISHED"
    assert re.fullmatch(r"prepare-[0-9a-f]{6}", run.info.run_name)  # stage + params digest
    assert run.data.params["data.channels"] == "1"
    assert run.data.params["seed"] == str(cfg.seed)
    assert run.data.metrics["images_bad"] == 5
    tags = run.data.tags
    for tag in ("tfmlops.stage", "tfmlops.params_hash", "tfmlops.data_version",
                "mlflow.source.git.commit", "tfmlops.git_dirty"):
        assert tag in tags
    manifest = (Path(cfg.paths.prepared) / "manifest.json").read_bytes()
    import hashlib

    assert tags["tfmlops.data_version"] == hashlib.sha256(manifest).hexdigest()[:16]
    (ds_input,) = run.inputs.dataset_inputs
    assert ds_input.dataset.digest == tags["tfmlops.data_version"]
    client = mlflow_client(cfg)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"prepared", "profile"} <= artifacts
    run_file = json.loads((Path(cfg.paths.prepared) / "mlflow_run.json").read_text())
    assert run_file["run_id"] == run.info.run_id


def test_two_runs_leave_two_profile_folders_side_by_side(tmp_path, make_cfg):
    """TensorBoard over reports/profiles shows each run (its own folder), not only the last."""
    mixed_folder(tmp_path / "own", per_class=6)
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.5},
                   profiling={"enabled": True, "start_step": 1, "steps": 1})
    prepare.run(cfg)
    prepare.run(cfg)
    folders = profiling.run_dirs(cfg, "prepare")
    assert len(folders) == 2
    assert all(profiling.trace_files(f) for f in folders)
    client = mlflow_client(cfg)
    for run in stage_runs(cfg, "prepare"):  # each run logged its own folder
        assert "profile" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_too_many_bad_files_fail_before_any_output(tmp_path, make_cfg):
    mixed_folder(tmp_path / "own", per_class=4)  # 5 bad of 17
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.1})
    with pytest.raises(DataError, match=r"5 of 17 files .* data.max_bad_fraction"):
        prepare.run(cfg)
    assert not Path(cfg.paths.prepared).exists()
    assert stage_runs(cfg, "prepare") == []
