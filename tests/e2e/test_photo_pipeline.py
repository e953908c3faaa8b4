"""The whole `dvc repro` on phone-like JPEG photos (a few PNGs, an EXIF-rotated JPEG),
3 channels at 64 px, tiny params: every stage passes, a version is registered and
promoted, and `mlflow models serve` answers an original photo as train's model does."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import requests

from conftest import LOOSE_GATE, child_env, dvc, relative_tiny_params, scratch_repo
from images import phone_photo_folder

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

STAGES = ["prepare", "tune", "train", "prune", "quantize", "export", "promote"]
ROTATED = "class_00/img_000003.jpg"  # the generator stores it sideways, EXIF orientation 6


@pytest.fixture(scope="module")
def photo_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("photo_e2e")
    photos = root / "photos"
    phone_photo_folder(photos, images=60)
    params = relative_tiny_params(
        data={"image_dir": str(photos), "channels": 3, "image_size": 64},
        # 42 train images: batches the search may pick must fit them
        tune={"max_trials": 2, "max_epochs": 1, "tuner": "random",
              "space": {"batch_size": [16, 32]}},
        train={"epochs": 4, "batch_size": 16},
        promote={"gate": {**LOOSE_GATE, "min_accuracy": 0.3, "max_latency_ms": 1000.0}},
    )
    repo = scratch_repo(root / "repo", params)
    first = dvc("repro", cwd=repo, timeout=1400)
    return repo, photos, first


def test_every_stage_passes_and_the_version_is_promoted(photo_repo):
    import mlflow

    repo, _, first = photo_repo
    for stage in STAGES:
        assert f"Running stage '{stage}'" in first.stdout, stage
    registered = json.loads((repo / "models/export/registered.json").read_text())
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    production = client.get_model_version_by_alias(registered["name"], "production")
    assert str(production.version) == str(registered["version"])
    export = json.loads((repo / "reports/export.json").read_text())
    assert export["parity.passed"] == 1
    for pair in ("saved_model_bytes", "served_pyfunc"):
        assert export[f"skew.{pair}.max_abs_diff"] <= 1e-4, pair
    skew = json.loads((repo / "models/export/skew.json").read_text())
    assert skew["source_sample"]["exif_rotated"] >= 1


def test_the_served_model_answers_an_original_photo_as_trains_model_does(photo_repo, tmp_path,
                                                                         monkeypatch):
    import local_server
    from tfmlops.config import load_config
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.model.artifacts import load_keras3
    from tfmlops.serving.skew import prepare_inputs

    repo, photos, _ = photo_repo
    monkeypatch.chdir(repo)  # the params' paths are the repo's relative ones
    prepared = load_prepared(load_config(repo / "params.yaml"))
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    original = (photos / ROTATED).read_bytes()
    x, kept = prepare_inputs(manifest, prepared, [original])
    assert kept == [0]
    keras_probs = load_keras3(repo / "models/train/model.keras").predict(x, verbose=0)[0]
    expected = manifest["classes"][int(np.argmax(keras_probs))]

    name = json.loads((repo / "models/export/registered.json").read_text())["name"]
    proc, url = local_server.start(f"models:/{name}@production", f"sqlite:///{repo / 'mlflow.db'}",
                                   tmp_path / "serve.log", env=child_env(), cwd=repo)
    try:
        local_server.wait_ready(proc, url, tmp_path / "serve.log", timeout_s=180)
        answer = requests.post(f"{url}/invocations", timeout=60, json={
            "dataframe_records": [{"image": base64.b64encode(original).decode()}]})
    finally:
        local_server.stop(proc)
    assert answer.status_code == 200, answer.text
    served = answer.json()["predictions"][0]
    assert served["label"] == expected, (served, keras_probs.tolist())
