"""`tfmlops doctor`: two epochs through the real stages in a temporary folder, then the
resolved precision, strategy and devices, as this host reports them (what a GPU user runs)."""

import json
from pathlib import Path

import pytest

from conftest import host_gpus, run_cli


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctor_trains_two_epochs_and_prints_what_it_resolved(tmp_path, make_cfg):
    cfg = make_cfg(train={"precision": "float32", "strategy": "auto"})
    proc = run_cli("doctor", cwd=tmp_path)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["epochs_run"] == 2
    assert result["precision_policy"] == "float32" and result["loss_scaling"] == "False"
    assert result["strategy"] and result["strategy_class"].endswith("Strategy")
    from tfmlops.model.strategy import resolve_strategy

    # what this host reports: no GPU here, N on a GPU machine (auto mirrors over 2 or more)
    gpus = host_gpus()
    assert len(result["gpus"]) == gpus
    assert result["replicas"] == (gpus if resolve_strategy("auto", None, gpus) == "mirrored" else 1)
    assert any("CPU" in d for d in result["devices"])
    assert result["jit_compile"] in ("True", "False")
    assert 0.0 <= result["test_accuracy"] <= 1.0
    assert "doctor: precision float32" in proc.stderr and "strategy" in proc.stderr
    # It trained in a temporary folder: nothing of the project's paths was written.
    for folder in (cfg.paths.prepared, cfg.paths.train, cfg.paths.reports):
        assert not Path(folder).exists(), folder
    assert not (tmp_path / "mlflow.db").exists()
