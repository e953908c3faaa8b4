"""mixed_bfloat16 training (issue 13): as accurate as float32, and its model goes
through prune, quantize (INT8 included) and export with every parity check passing.

The saved model's layers keep their mixed_bfloat16 policy (float32 weights, bf16
compute); the later stages rebuild it in float32, so the exports reproduce the
model as served on CPUs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import run_cli, tiny_params
from tfmlops.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_bfloat16_trained_model_quantizes_and_exports_with_parity(tmp_path, prepared_digits):
    from tfmlops.model.trained import load_keras3, trained_model_path

    shutil.copytree(prepared_digits.paths.prepared, tmp_path / "data" / "prepared")
    params = tiny_params(tmp_path,
                         train={"use_tuned": False, "epochs": 6, "precision": "mixed_bfloat16"},
                         prune={"epochs": 1}, quantize={"qat": False},
                         promote={"gate": {"min_accuracy": 0.3}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cfg = load_config(tmp_path / "params.yaml")
    for stage in ("train", "prune", "quantize", "export"):
        run_cli(stage, cwd=tmp_path)

    model = load_keras3(trained_model_path(cfg))
    assert model.get_layer("block0_conv0").dtype_policy.name == "mixed_bfloat16"
    reports = Path(cfg.paths.reports)
    trained = json.loads((reports / "train.json").read_text())
    assert trained["test_accuracy"] > 0.5

    quantized = json.loads((reports / "quantize.json").read_text())
    assert quantized["failed"] == {}
    assert "pruned_int8" in quantized["variants"]
    for name in ("trained_float32", "trained_int8"):
        row = quantized["variants"][name]
        # The TFLite variants answer as the (float32-rebuilt) bf16-trained model does.
        assert row["accuracy"] >= quantized["reference_accuracy"] - 0.05, name
        assert row["agreement"] >= 0.9, name

    exported = json.loads((reports / "export.json").read_text())
    assert exported["parity.passed"] == 1
    assert exported["parity.onnx.max_abs_diff"] <= cfg.export.atol
    assert exported["onnx.accuracy"] == exported["keras.accuracy"]
    assert abs(exported["keras.accuracy"] - trained["test_accuracy"]) <= 0.02


def test_bfloat16_trains_as_well_as_float32(tmp_path, prepared_digits, make_cfg):
    """The tiny digits config, trained by the train stage in each policy, same seed and
    data. The issue's 0.5 pt target on the full default digits is a benchmark
    (benchmarks/precision.py accuracy); on this tiny model one test image is 0.4 pt."""
    from tfmlops.stages import train

    accuracy = {}
    for policy in ("float32", "mixed_bfloat16"):
        workdir = tmp_path / policy
        shutil.copytree(prepared_digits.paths.prepared, workdir / "data" / "prepared")
        cfg = make_cfg(workdir, tracking={"enabled": False},
                       train={"use_tuned": False, "epochs": 10, "precision": policy,
                              "optimizer": {"learning_rate": 0.01}})
        accuracy[policy] = train.run(cfg)["test_accuracy"]
    assert accuracy["float32"] > 0.8, accuracy  # it learned: the comparison means something
    # 262 test images; two runs of one seed diverge by rounding alone: 4 pt is ~10 images.
    assert abs(accuracy["float32"] - accuracy["mixed_bfloat16"]) <= 0.04, accuracy
