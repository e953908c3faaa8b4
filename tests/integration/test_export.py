"""`export` end to end on a tiny trained model: formats, parity, registration, MLproject."""

from __future__ import annotations

import base64
import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT, VENV_BIN, child_env, mlflow_client, relative_tiny_params, scratch_repo
from tfmlops import profiling
from tfmlops.artifacts import FORMATS_CSV, MODEL_CARD, MODEL_FILE, REGISTERED, SERVING, TAG_STAGE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # trains and exports a model


def test_every_format_is_written_checked_and_measured(exported_digits):
    cfg = exported_digits
    out = Path(cfg.paths.export)
    saved = out / "saved_model" / cfg.export.model_name / "1"
    assert (saved / "saved_model.pb").is_file() and (saved / "variables").is_dir()
    for name in ("model.onnx", "model.tflite", SERVING, MODEL_CARD,
                 REGISTERED):
        assert (out / name).is_file(), name
    metrics = json.loads((Path(cfg.paths.reports) / "export.json").read_text())
    assert metrics["parity.passed"] == 1
    assert metrics["parity.onnx.max_abs_diff"] <= cfg.export.atol
    assert metrics["parity.saved_model_bytes.max_abs_diff"] <= cfg.export.atol
    assert metrics["onnx.accuracy"] == metrics["keras.accuracy"] > 0.5
    with open(Path(cfg.paths.reports) / FORMATS_CSV) as fh:
        rows = {r["format"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"keras", "saved_model", "onnx", "tflite", "served_pyfunc"}
    for row in rows.values():
        assert int(row["bytes"]) > 0 and float(row["p50_ms"]) > 0
    served = json.loads((out / SERVING).read_text())
    # The fastest of the served runtimes (parity passed for all here, checked above).
    assert served["runtime"] == min(("onnx", "tflite"), key=lambda r: float(rows[r]["p50_ms"]))
    assert rows[served["runtime"]]["served"] == "True"


def test_the_version_is_registered_with_tags_card_and_lineage(exported_digits):
    cfg = exported_digits
    registered = json.loads((Path(cfg.paths.export) / REGISTERED).read_text())
    assert registered["name"] == cfg.promote.registered_model
    client = mlflow_client(cfg)
    mv = client.get_model_version(registered["name"], registered["version"])
    tags = mv.tags
    for fmt in ("keras", "saved_model", "onnx", "tflite"):
        assert float(tags[f"accuracy.{fmt}"]) > 0.5
        assert int(tags[f"bytes.{fmt}"]) > 0
    assert tags["parity.passed"] == "true"
    assert tags["parity.onnx"].startswith("pass")
    assert tags["lineage.run.export"] == registered["run_id"]
    assert tags["lineage.git_commit"] and "lineage.run.train" in tags
    assert mv.description.startswith(f"# {registered['name']}")
    assert "## Lineage" in mv.description
    run = client.get_run(registered["run_id"])
    assert run.data.tags[TAG_STAGE] == "export"
    artifacts = {a.path for a in client.list_artifacts(registered["run_id"])}
    assert MODEL_CARD in artifacts
    assert "profile" in artifacts  # a trace of the bytes-in serving function
    assert profiling.trace_files(profiling.profile_dir(cfg, "export"))
    model = client.get_logged_model(registered["model_uri"].rsplit("/", 1)[-1])
    assert model.source_run_id == registered["run_id"]


def test_the_savedmodel_takes_any_image_and_matches_the_served_path(exported_digits,
                                                                   exported_offline):
    """PNG/JPEG, gray/colour/transparent, any size: in-graph == the served NumPy path."""
    import tensorflow as tf
    from PIL import Image

    from tfmlops.serving.predictor import Predictor
    from tfmlops.stages.export.signatures import BYTES_SIGNATURE, FLOAT_SIGNATURE

    cfg, offline = exported_digits, exported_offline
    out = Path(cfg.paths.export)
    loaded = tf.saved_model.load(str(out / "saved_model" / cfg.export.model_name / "1"))
    assert {BYTES_SIGNATURE, FLOAT_SIGNATURE, "serving_default"} <= set(loaded.signatures)
    digit = Image.open(io.BytesIO(offline["encoded"][0]))
    images = [
        _encode(digit.convert("RGB").resize((37, 29)), "JPEG", quality=92),
        _encode(digit.convert("RGBA").resize((24, 24)), "PNG"),
        _encode(digit.resize((5, 7)), "PNG"),
        offline["encoded"][1],
    ]
    got = loaded.signatures[BYTES_SIGNATURE](image_bytes=tf.constant(images))
    predictor = Predictor.from_files(out / json.loads((out / SERVING).read_text())["file"],
                                     out / SERVING)
    served = predictor.predict_rows([{"image": base64.b64encode(b).decode()} for b in images])
    # The first two are reduced to the stored short side (OpenCV's fixed-point bilinear vs
    # TensorFlow's: within one grey level, serving.signatures); the others are not: exact.
    probs, served_probs = got["probabilities"].numpy(), np.asarray(served["probabilities"])
    np.testing.assert_allclose(probs[:2], served_probs[:2], atol=1e-2)
    np.testing.assert_allclose(probs[2:], served_probs[2:], atol=cfg.export.atol)
    assert [s.decode() for s in got["label"].numpy()] == served["label"]
    floats = loaded.signatures[FLOAT_SIGNATURE](image=tf.constant(offline["x"][:8]))
    np.testing.assert_allclose(floats["probabilities"].numpy(), offline["probs"][:8], atol=1e-5)


def test_onnx_parity_fails_on_a_perturbed_model(exported_digits, exported_offline, tmp_path):
    from tfmlops.errors import DataError
    from tfmlops.stages.export.formats import check_onnx

    cfg, offline = exported_digits, exported_offline
    source = Path(cfg.paths.export) / "model.onnx"
    assert check_onnx(source, offline["split"], offline["probs"], cfg.export.atol)[0].passed
    perturbed = tmp_path / "perturbed.onnx"
    shutil.copy2(source, perturbed)
    perturb_onnx_bias(perturbed)
    with pytest.raises(DataError) as err:
        check_onnx(perturbed, offline["split"], offline["probs"], cfg.export.atol)
    message = str(err.value)
    assert "onnx parity FAILED" in message and "over by" in message
    assert "\n" not in message


def perturb_onnx_bias(path: Path) -> None:
    """Give class 0 a little more evidence everywhere in an ONNX file (a wrong conversion)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    bias = next(t for t in model.graph.initializer if "logits" in t.name and "Bias" in t.name)
    values = numpy_helper.to_array(bias).copy()
    values[0] += 0.5
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(path))


@pytest.mark.slow
def test_the_export_stage_refuses_an_onnx_file_that_disagrees(exported_digits, tmp_path,
                                                              monkeypatch):
    """The stage itself, not only its check: an ONNX conversion off by a bias fails export
    with the parity line, and nothing is registered or left in paths.export."""
    from tfmlops.config import load_config
    from tfmlops.errors import DataError
    from tfmlops.stages import export
    from tfmlops.stages.export import formats

    source = exported_digits
    params = yaml.safe_load((Path(source.paths.export).parent.parent / "params.yaml").read_text())
    params["paths"]["export"] = str(tmp_path / "export")
    params["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = load_config(tmp_path / "params.yaml")
    real = formats.to_onnx

    def converted_wrong(model, path, *args, **kwargs):
        real(model, path, *args, **kwargs)
        perturb_onnx_bias(path)

    monkeypatch.setattr(formats, "to_onnx", converted_wrong)
    with pytest.raises(DataError, match="onnx parity FAILED.*over by"):
        export.run(cfg)
    assert not Path(cfg.paths.export).exists()
    assert mlflow_client(cfg).search_model_versions(
        f"name = '{cfg.promote.registered_model}'") == []


def test_export_without_quantize_output_fails_in_one_line(exported_digits, tmp_path):
    from tfmlops.config import load_config
    from tfmlops.errors import DataError
    from tfmlops.stages import export

    params = yaml.safe_load((Path(exported_digits.paths.export).parent.parent
                             / "params.yaml").read_text())
    params["paths"]["tflite"] = str(tmp_path / "no_tflite")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(DataError, match="run `dvc repro quantize` first"):
        export.run(load_config(tmp_path / "params.yaml"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_run_entry_point(tmp_path):
    """`mlflow run . -e check --env-manager local` in a scratch copy of the project."""
    repo = tmp_path / "repo"
    scratch_repo(repo, relative_tiny_params())
    shutil.copy2(ROOT / "MLproject", repo / "MLproject")
    env = {**child_env(),
           "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}"}
    proc = subprocess.run([str(VENV_BIN / "mlflow"), "run", ".", "-e", "check",
                           "--env-manager", "local", "--experiment-name", "tfmlops"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "params.yaml: ok" in proc.stderr  # the CLI's messages go to stderr
    assert "succeeded" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mlflow_run_runs_a_stage_under_its_launcher_run(tmp_path):
    """docs/stages.md: `mlflow run . -e train --env-manager local` runs one stage as an MLflow
    Project; the stage's own run is nested under the run `mlflow run` opens (MLproject)."""
    import mlflow

    repo = tmp_path / "repo"
    scratch_repo(repo, relative_tiny_params(train={"use_tuned": False}))
    shutil.copy2(ROOT / "MLproject", repo / "MLproject")
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    env = {**child_env(), "MLFLOW_TRACKING_URI": uri}
    for entry in ("materialize", "prepare", "train"):
        proc = subprocess.run([str(VENV_BIN / "mlflow"), "run", ".", "-e", entry,
                               "--env-manager", "local", "--experiment-name", "tfmlops"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=500)
        assert proc.returncode == 0, f"{entry}: {proc.stderr[-3000:]}"
    assert (repo / "models" / "train" / MODEL_FILE).is_file()
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tfmlops").experiment_id])
    (stage,) = [r for r in runs if r.data.tags.get(TAG_STAGE) == "train"]
    launcher = client.get_run(stage.data.tags["mlflow.parentRunId"])
    assert launcher.data.tags.get("mlflow.project.entryPoint") == "train"
    assert stage.info.status == launcher.info.status == "FINISHED"


def _encode(image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()
