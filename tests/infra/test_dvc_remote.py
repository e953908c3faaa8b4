"""A DVC filesystem remote: push after a run, pull into a fresh clone, nothing reruns.

The run-cache travels too: a clone without dvc.lock restores a stage from the
pulled run-cache ("cached - skipping run") instead of running it. DVC 3.67
restores that way only stages whose outputs are all cached, and `dvc push` uploads
only cached outputs: every output of the pipeline is cached (the reports and the
persisted tuner and backup folders too), so a teammate's clone misses none of them.
"""

import shutil
from pathlib import Path

import pytest

from conftest import dvc, git, relative_tiny_params, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

STAGES = ("materialize", "prepare")
# A small built-in dataset: what is tested is the transfer, not the data.
SMALL = {"builtin": "synthetic", "channels": 3,
         "synthetic": {"count": 120, "image_size": 16, "classes": 3}}


def test_push_clone_pull_and_nothing_reruns(tmp_path):
    repo = scratch_repo(tmp_path / "repo", relative_tiny_params(data=SMALL))
    remote = tmp_path / "remote"
    dvc("remote", "add", "-d", "storage", str(remote), cwd=repo)
    ran = dvc("repro", "prepare", cwd=repo)
    assert all(f"Running stage '{s}'" in ran.stdout for s in STAGES)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "prepare ran; remote configured", cwd=repo)
    dvc("push", "--run-cache", cwd=repo)
    assert any(remote.rglob("*")) and (remote / "runs").is_dir()

    clone = tmp_path / "clone"
    git("clone", "-q", str(repo), str(clone), cwd=tmp_path)
    assert not (clone / "data" / "prepared").exists()
    dvc("pull", "--run-cache", "--with-deps", "prepare", cwd=clone)
    manifest = Path("data/prepared/manifest.json")
    assert (clone / manifest).read_bytes() == (repo / manifest).read_bytes()

    again = dvc("repro", "prepare", cwd=clone)
    assert "Running stage" not in again.stdout
    assert "up to date" in again.stdout
    status = dvc("status", "prepare", cwd=clone)
    assert "up to date" in status.stdout and "changed" not in status.stdout
    assert "in sync" in dvc("status", "--cloud", "--with-deps", "prepare", cwd=clone).stdout

    # Without dvc.lock and outputs, only the pulled run-cache can spare the run.
    pulled_runs = {p.name for p in (clone / ".dvc" / "cache" / "runs").glob("*/*")}
    assert pulled_runs == {p.name for p in (repo / ".dvc" / "cache" / "runs").glob("*/*")}
    (clone / "dvc.lock").unlink()
    shutil.rmtree(clone / "data" / "builtin")
    restored = dvc("repro", "materialize", cwd=clone)
    assert "Running stage" not in restored.stdout
    assert "Stage 'materialize' is cached - skipping run" in restored.stdout
    assert len(list((clone / "data" / "builtin").rglob("*.png"))) == 120
    assert not (clone / "mlflow.db").exists()  # no stage ran in the clone


def test_a_teammates_clone_pulls_the_whole_pipeline_and_reruns_only_promote(pipeline_repo,
                                                                             tmp_path):
    """The team flow (docs/scaling.md) on the whole pipeline: `dvc push --run-cache` after a run,
    a teammate's `git clone` + `dvc pull --run-cache`, then `dvc repro` runs nothing but
    promote (always_changed), which finds production already holding the version. The
    teammate's MLflow store is the shared one (here: the first repo's database)."""
    import re

    from conftest import repo_copy

    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    remote = tmp_path / "remote"
    dvc("remote", "add", "-d", "storage", str(remote), cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "the pipeline ran; remote configured", cwd=repo)
    dvc("push", "--run-cache", cwd=repo)

    clone = tmp_path / "clone"
    git("clone", "-q", str(repo), str(clone), cwd=tmp_path)
    dvc("pull", "--run-cache", cwd=clone)
    shared = {"MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}"}
    again = dvc("repro", cwd=clone, env=shared)
    assert re.findall(r"Running stage '([\w-]+)'", again.stdout) == ["promote"], again.stdout
    assert "already holds @production; nothing to do" in again.stdout + again.stderr
    for model in ("models/train/model.keras", "models/export/model.onnx"):
        assert (clone / model).read_bytes() == (repo / model).read_bytes(), model
