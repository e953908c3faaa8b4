"""The whole `dvc repro` with a pretrained backbone, on the suite's one RGB photo pipeline
(tests/rgb_photos.py: phone-like photos at 32 px, 3 classes): every stage passes, the
model learned, full INT8 agrees with it, and train's two phases are one MLflow history.

RGB shapes (the 1-channel repeat is covered by tests/model/test_backbones.py).
"""

import json

import pytest

from rgb_photos import CHANCE

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]

STAGES = ["materialize", "prepare", "tune", "train", "prune", "quantize", "export", "promote"]


def test_every_stage_passes_with_a_backbone(rgb_photo_repo):
    repo, _, first = rgb_photo_repo
    for stage in STAGES:
        assert f"Running stage '{stage}'" in first.stdout, stage
    export = json.loads((repo / "reports" / "export.json").read_text())
    assert export["parity.passed"] == 1  # ONNX (and every other format) matches Keras
    quantize = json.loads((repo / "reports" / "quantize.json").read_text())
    assert quantize["failed"] == {}
    assert sorted(quantize["variants"]) == ["pruned_int8", "trained_int8"]
    int8 = quantize["variants"]["trained_int8"]  # full INT8 of the backbone model
    assert int8["input_dtype"] == "int8", int8
    # INT8 of the trained backbone agrees with its float model on most test images (0.86
    # measured; the pruned one, fine-tuned for one epoch, is not held to it)
    assert int8["agreement"] >= 0.6, int8
    # One model through the stages: export scores train's model on the same test split as
    # train did, and every exported format agrees with it (a wrong model, preprocessing or
    # split between the stages shows here, however well the tiny model learned).
    train = json.loads((repo / "reports" / "train.json").read_text())
    assert export["keras.accuracy"] == pytest.approx(train["test_accuracy"], abs=1e-6)
    assert train["test_accuracy"] > CHANCE  # it learned: 0.5 measured
    assert export["onnx.accuracy"] == export["keras.accuracy"]
    decision = json.loads((repo / "reports" / "promote.json").read_text())
    assert decision["promoted"] is True and decision["failed"] == []


def test_train_shows_both_phases_in_one_mlflow_history(rgb_photo_repo):
    import mlflow

    repo, _, _ = rgb_photo_repo
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tfmlops")
    runs = client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'train'")
    run = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    phase = client.get_metric_history(run.info.run_id, "phase")
    assert [(m.step, m.value) for m in sorted(phase, key=lambda m: m.step)] == [(1, 1.0), (2, 2.0)]
    val_loss = client.get_metric_history(run.info.run_id, "val_loss")
    assert sorted(m.step for m in val_loss) == [1, 2]  # steps continue across the phases
    assert run.data.params.get("resolved.fine_tune_phases") == "2"
