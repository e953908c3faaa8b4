"""Real DVC in a scratch git repo: prepare caches, reruns on change, exp runs are tracked."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import dvc, git, relative_tiny_params, scratch_repo
from tfmlops.tracking.lineage import wait_delivered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def prepare_runs(repo: Path):
    """prepare's runs, once the last one is delivered (its sidecar delivers after
    `dvc repro` returns; a later stage waits for it the same way)."""
    import mlflow

    assert wait_delivered(repo / "reports" / "prepare", timeout_s=120)
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tfmlops")
    return client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'prepare'")


def test_prepare_caches_and_reruns_only_on_change(tmp_path):
    repo = scratch_repo(tmp_path / "repo", relative_tiny_params())
    first = dvc("repro", "prepare", cwd=repo)
    assert "Running stage 'materialize'" in first.stdout
    assert "Running stage 'prepare'" in first.stdout
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert {"materialize", "prepare"} <= set(lock)
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    assert manifest["split_counts"]["train"] > 1000

    again = dvc("repro", "prepare", cwd=repo)
    assert "Running stage" not in again.stdout
    assert "up to date" in again.stdout

    # a prepare param changes: prepare reruns, materialize does not
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"]["shards"] = 3
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = dvc("repro", "prepare", cwd=repo)
    assert "Running stage 'prepare'" in changed.stdout
    assert "Running stage 'materialize'" not in changed.stdout
    assert len(list((repo / "data/prepared").glob("train-*-of-00003.tfrecord"))) == 3

    # own images: one image added to the folder invalidates prepare
    own = repo / "own"
    shutil.copytree(repo / "data/builtin", own)
    params["data"]["image_dir"] = "own"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dvc("repro", "prepare", cwd=repo)
    assert "up to date" in dvc("repro", "prepare", cwd=repo).stdout
    shutil.copy2(own / "3" / "digit_0003.png", own / "3" / "copy.png")
    added = dvc("repro", "prepare", cwd=repo)
    assert "Running stage 'prepare'" in added.stdout
    assert len(prepare_runs(repo)) == 4


def test_exp_run_temp_lands_in_the_repo_store_with_its_name(tmp_path):
    repo = scratch_repo(tmp_path / "repo", relative_tiny_params())
    dvc("exp", "run", "--temp", "-n", "fewer-shards", "-S", "data.shards=1", "prepare", cwd=repo)
    runs = prepare_runs(repo)
    assert len(runs) == 1
    assert runs[0].data.tags["dvc.exp_name"] == "fewer-shards"
    assert runs[0].data.params["data.shards"] == "1"
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))
    # the workspace is untouched by a temp run: nothing changed, nothing new but ignored files
    assert git("status", "--short", "--untracked-files=all", cwd=repo) == ""
    assert not (repo / "data" / "prepared").exists()


@pytest.mark.distributed
def test_switching_prepare_to_beam_changes_no_byte_dvc_tracks(tmp_path):
    """data.engine: beam writes data/prepared byte for byte as local does, so DVC records
    the same hash for it and reruns nothing after prepare (prepare's own run file is in
    reports/prepare/, not in the data)."""
    repo = scratch_repo(tmp_path / "repo", relative_tiny_params())
    dvc("repro", "prepare", cwd=repo)
    md5 = lambda: {o["path"]: o["md5"] for o in yaml.safe_load(  # noqa: E731
        (repo / "dvc.lock").read_text())["stages"]["prepare"]["outs"]}
    local = md5()
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"].update(engine="beam", beam={"options": [
        "--runner=DirectRunner", "--direct_running_mode=multi_processing",
        "--direct_num_workers=2"]})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    switched = dvc("repro", "prepare", cwd=repo)
    assert "Running stage 'prepare'" in switched.stdout  # its params changed
    timings = "reports/prepare.json"  # the metrics: seconds, images/s
    assert {k: v for k, v in md5().items() if k != timings} == \
        {k: v for k, v in local.items() if k != timings}
    assert "data/prepared" in local
    assert len(prepare_runs(repo)) == 2
