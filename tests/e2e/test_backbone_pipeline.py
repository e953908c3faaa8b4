"""The whole `dvc repro` with a pretrained backbone at 32x32: every stage passes.

RGB shapes (the 1-channel repeat is covered by tests/model/test_backbones.py). Offline:
the "pretrained" weights are a randomly initialised MobileNetV3Small whose
BatchNormalization statistics were set from one batch (so its inference-mode
features do not vanish), saved by the test as a local weights file.
"""

import json

import numpy as np
import pytest

from conftest import LOOSE_GATE, dvc, relative_tiny_params, scratch_repo

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]

STAGES = ["materialize", "prepare", "tune", "train", "prune", "quantize", "export", "promote"]
WEIGHTS = "weights/mobilenet_v3_small.weights.h5"
CHANCE = 1 / 3 + 0.01  # three classes


def save_pretend_pretrained(path):
    import keras

    from tfmlops.model import backbones

    keras.utils.set_random_seed(0)
    base = backbones.application("mobilenet_v3_small", keras, input_shape=(32, 32, 3))
    bns = [layer for layer in base.layers if type(layer).__name__ == "BatchNormalization"]
    for bn in bns:
        bn.momentum = 0.0  # moving statistics := this batch's
    x = np.random.default_rng(0).uniform(0, 255, (16, 32, 32, 3)).astype("float32")
    head = keras.Sequential([base, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    head.compile(optimizer=keras.optimizers.SGD(1e-6), loss="mse")
    head.fit(x, np.zeros((16, 2), "float32"), batch_size=16, epochs=1, verbose=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    base.save_weights(path)


@pytest.fixture(scope="module")
def backbone_repo(tmp_path_factory):
    # Kept small: a backbone's TFLite/ONNX conversions dominate (a few hundred RGB shapes,
    # no search: tune's trials on a backbone run the same fit_in_phases as train).
    params = relative_tiny_params(
        data={"builtin": "synthetic", "channels": 3, "image_size": 32,
              "synthetic": {"count": 240, "image_size": 32, "classes": 3}},
        model={"backbone": "mobilenet_v3_small", "backbone_weights": WEIGHTS, "head_units": 0},
        train={"epochs": 2, "precision": "float32",
               "fine_tune": {"head_epochs": 1, "unfreeze": 0.2, "lr_factor": 0.1}},
        tune={"enabled": False},
        # Two conversions, not nine (each takes about 30 s on a backbone): full INT8 of the
        # pruned and of the trained model.
        quantize={"representative_samples": 16, "variants": ["int8"]},
        # Above chance (1/3): the gate's pass means the backbone model learned something
        # (0.5 on the 36 test images here, from random "pretrained" weights).
        promote={"gate": {**LOOSE_GATE, "min_accuracy": CHANCE, "max_latency_ms": 1000.0,
                          "max_size_bytes": 100_000_000}},
    )
    repo = scratch_repo(tmp_path_factory.mktemp("e2e_backbone") / "repo", params)
    save_pretend_pretrained(repo / WEIGHTS)
    return repo, dvc("repro", cwd=repo, timeout=2400)


def test_every_stage_passes_with_a_backbone(backbone_repo):
    repo, first = backbone_repo
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


def test_train_shows_both_phases_in_one_mlflow_history(backbone_repo):
    import mlflow

    repo, _ = backbone_repo
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tfmlops")
    runs = client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'train'")
    run = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    phase = client.get_metric_history(run.info.run_id, "phase")
    assert [(m.step, m.value) for m in sorted(phase, key=lambda m: m.step)] == [(1, 1.0), (2, 2.0)]
    val_loss = client.get_metric_history(run.info.run_id, "val_loss")
    assert sorted(m.step for m in val_loss) == [1, 2]  # steps continue across the phases
    assert run.data.params.get("resolved.fine_tune_phases") == "2"
