"""The whole `dvc repro` on phone-like JPEG photos (a few PNGs, an EXIF-rotated JPEG),
3 channels at 32 px (the suite's one RGB photo pipeline, tests/rgb_photos.py): every
stage passes, a version is registered and promoted, and `mlflow models serve` answers
an original photo as train's model does."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import requests

from conftest import child_env
from rgb_photos import ROTATED

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]

STAGES = ["prepare", "tune", "train", "prune", "quantize", "export", "promote"]


def test_every_stage_passes_and_the_version_is_promoted(rgb_photo_repo):
    import mlflow

    repo, _, first = rgb_photo_repo
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


def test_the_served_model_answers_an_original_photo_as_trains_model_does(rgb_photo_repo,
                                                                         tmp_path, monkeypatch):
    import local_server
    from tfmlops.config import load_config
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.model.trained import load_keras3
    from tfmlops.stages.export.skew import prepare_inputs

    repo, photos, _ = rgb_photo_repo
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
