"""`tfmlops doctor`: two epochs through the real stages in a temporary folder, then the
resolved precision, strategy and devices, as this host reports them (what a GPU user runs)."""

import json
from pathlib import Path

import pytest

from conftest import host_gpus, run_cli


def cpu_flags() -> set[str]:
    """The CPU's flags as /proc/cpuinfo lists them (read here, not through tfmlops)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# docs/stages.md's rule for `train.precision: auto` with dense convolutions (the doctor's model):
# a GPU of compute capability 7.0 or newer -> mixed_float16; a CPU with AMX tiles ->
# mixed_bfloat16; any other CPU, avx512_bf16 included (its bf16 ran slower here) -> float32.
def expected_policy(gpus: int, flags: set[str]) -> str:
    if gpus:
        import tensorflow as tf

        caps = [tf.config.experimental.get_device_details(g).get("compute_capability", (0, 0))
                for g in tf.config.list_physical_devices("GPU")]
        return "mixed_float16" if all(tuple(c) >= (7, 0) for c in caps) else "float32"
    return "mixed_bfloat16" if "amx_bf16" in flags else "float32"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctor_trains_two_epochs_and_prints_what_it_resolved(tmp_path, make_cfg):
    cfg = make_cfg(train={"precision": "auto", "strategy": "auto"})
    proc = run_cli("doctor", cwd=tmp_path)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["epochs_run"] == 2
    policy = expected_policy(host_gpus(), cpu_flags())
    assert result["precision_policy"] == policy
    assert result["loss_scaling"] == str(policy == "mixed_float16")  # float16 only
    assert result["strategy"] and result["strategy_class"].endswith("Strategy")
    from tfmlops.stages.train.strategy import resolve_strategy

    # what this host reports: no GPU here, N on a GPU machine (auto mirrors over 2 or more)
    gpus = host_gpus()
    assert len(result["gpus"]) == gpus
    assert result["replicas"] == (gpus if resolve_strategy("auto", None, gpus) == "mirrored" else 1)
    assert any("CPU" in d for d in result["devices"])
    assert result["test_accuracy"] > 0.3  # two epochs learned something (chance: 0.1)
    assert f"doctor: precision {policy}" in proc.stderr and "strategy" in proc.stderr
    # It trained in a temporary folder: nothing of the project's paths was written.
    for folder in (cfg.paths.prepared, cfg.paths.train, cfg.paths.reports):
        assert not Path(folder).exists(), folder
    assert not (tmp_path / "mlflow.db").exists()
