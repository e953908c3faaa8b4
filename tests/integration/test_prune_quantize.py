"""`prune` then `quantize` end to end on tiny real digits, through the real CLI.

Both stages run in their own `tfmlops` process: they set TF_USE_LEGACY_KERAS=1
and import tfmot, which must never happen inside this pytest process. The
trained model they start from is built here with the shared builder (Keras 3),
as the `train` stage writes it. The tiny model has squeeze-and-excitation
blocks, a layer tfmot can neither prune nor quantize: both stages must report
it and go on.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import mlflow_client, profile_runs, run_cli, stage_runs, tiny_params
from tfmlops.artifacts import EDGE, FRONTIER_PNG, MANIFEST, MODEL_FILE, RUN_FILE, TAG_EDGE_VARIANT
from tfmlops.config import load_config

FINAL_SPARSITY = 0.6
SECTIONS = {
    "model": {"squeeze_excite": True},
    "prune": {"final_sparsity": FINAL_SPARSITY, "epochs": 3, "frequency": 10,
              "learning_rate": 0.001},
    "quantize": {"qat": True, "qat_epochs": 1, "representative_samples": 32,
                 "accuracy_budget": 0.05,
                 "variants": ["float32", "dynamic", "float16", "int8", "int8_sparse"]},
    "profiling": {"enabled": True, "start_step": 2, "steps": 2},
}
BASE_VARIANTS = ("float32", "dynamic", "float16", "int8")
ALL_VARIANTS = [f"{s}_{v}" for s in ("pruned", "trained")
                for v in BASE_VARIANTS + (("int8_sparse",) if s == "pruned" else ())]
ALL_VARIANTS.append("pruned_qat_int8")


def train_tiny_model(cfg) -> None:
    """What `train` leaves behind: paths.train/model.keras (Keras 3) + resolved params."""
    import keras

    from tfmlops.data import pipeline
    from tfmlops.model.builder import build_model
    from tfmlops.model.trained import write_resolved

    keras.utils.set_random_seed(cfg.seed)
    prepared = pipeline.load_prepared(cfg)
    model = build_model(cfg.model, keras, prepared.input_shape, prepared.num_classes)
    model.compile(optimizer=keras.optimizers.Adam(0.005),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(pipeline.dataset(cfg, prepared, "train", batch_size=32, training=True),
              epochs=2, verbose=0)
    folder = Path(cfg.paths.train)
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / MODEL_FILE)
    write_resolved(cfg, folder)


def write_params(workdir: Path, **sections) -> Path:
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_params(workdir, **sections), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, prepared_digits):
    """One workdir taken through train (here), `tfmlops prune` and `tfmlops quantize`."""
    workdir = tmp_path_factory.mktemp("prune_quantize")
    shutil.copytree(prepared_digits.paths.prepared, workdir / "data" / "prepared")
    cfg = load_config(write_params(workdir, **SECTIONS))
    train_tiny_model(cfg)
    # Each stage's log (the tfmlops logger, on stderr), kept for the progress tests.
    (workdir / "prune.stderr").write_text(run_cli("prune", cwd=workdir).stderr)
    (workdir / "quantize.stderr").write_text(run_cli("quantize", cwd=workdir).stderr)
    return cfg


def report(cfg, name: str) -> dict:
    return json.loads((Path(cfg.paths.reports) / name).read_text())


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def kernels_of(keras_file: Path) -> dict[str, np.ndarray]:
    """Conv/Dense kernels straight from the saved file's weights (no Keras involved)."""
    import h5py

    with zipfile.ZipFile(keras_file) as archive:
        blob = archive.read("model.weights.h5")
    found = {}
    with h5py.File(io.BytesIO(blob), "r") as h5:
        for name, group in h5["layers"].items():
            if name.startswith(("conv2d", "dense")):
                found[name] = np.asarray(group["vars"]["0"])
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_prune_reaches_the_scheduled_sparsity(compressed):
    cfg = compressed
    metrics = report(cfg, "prune.json")
    # The stripped model on disk: every pruned kernel holds the final sparsity.
    kernels = kernels_of(Path(cfg.paths.pruned) / MODEL_FILE)
    assert len(kernels) == 4  # two convs, head_dense, logits (SE dense layers are not pruned)
    for name, kernel in kernels.items():
        assert np.mean(kernel == 0) == pytest.approx(FINAL_SPARSITY, abs=0.02), name
    total = sum(k.size for k in kernels.values())
    zeros = sum(int(np.sum(k == 0)) for k in kernels.values())
    assert metrics["sparsity"] == pytest.approx(zeros / total, abs=1e-6)
    assert metrics["target_sparsity"] == FINAL_SPARSITY

    schedule = metrics["schedule"]
    assert schedule["end_step"] <= schedule["total_steps"]
    assert schedule["end_step"] % schedule["frequency"] == schedule["begin_step"]
    # The layers tfmot cannot prune are listed, and left dense.
    assert metrics["left_dense"] == ["block0_se", "block1_se"]
    rows = {r["layer"]: r for r in read_csv(Path(cfg.paths.reports) / "prune_sparsity.csv")}
    assert rows["block0_se"]["prunable"] == "False" and float(rows["block0_se"]["sparsity"]) < 0.5
    assert rows["head_dense"]["prunable"] == "True"
    assert sum(r["prunable"] == "True" for r in rows.values()) == metrics["prunable_layers"] == 4
    assert metrics["accuracy_delta"] == pytest.approx(
        metrics["test_accuracy"] - metrics["trained_test_accuracy"], abs=1e-5)
    assert metrics["gzip_bytes_pruned"] < metrics["gzip_bytes_unpruned"]

    # Tracked: run finished, metrics logged, run file beside the model, summaries and a trace.
    (run,) = stage_runs(cfg, "prune")
    assert run.info.status == "FINISHED"
    # The kept epoch: the lowest val_loss among the epochs that end at full sparsity.
    losses = [m.value for m in sorted(
        mlflow_client(cfg).get_metric_history(run.info.run_id, "fine_tune_val_loss"),
        key=lambda m: m.step)]
    # every epoch run is logged; an early end (prune.stop_when_recovered) only at full
    # sparsity, with the trained model's validation count
    ran = metrics["fine_tune_epochs"]
    assert len(losses) == ran and 1 <= ran <= 3
    full = [e for e in range(ran) if (e + 1) * schedule["steps_per_epoch"] >= schedule["end_step"]]
    assert full and metrics["kept_epoch"] == 1 + min(full, key=lambda e: losses[e])  # 1-based
    if ran < 3:
        assert metrics["stopped_at_epoch"] == ran and ran - 1 in full
    assert run.data.metrics["sparsity"] == pytest.approx(metrics["sparsity"])
    run_file = json.loads((Path(cfg.paths.pruned) / RUN_FILE).read_text())
    assert run_file["run_id"] == run.info.run_id
    artifacts = {a.path for a in mlflow_client(cfg).list_artifacts(run.info.run_id)}
    assert {"model", "reports", "profile"} <= artifacts
    (profile,) = profile_runs(cfg, "prune")  # this run's folder under profiles/prune
    assert list(profile.rglob("*.xplane.pb")) and list((profile / "metrics").glob("events.*"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_variant_is_built_loaded_and_evaluated(compressed):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tfmlops.data import pipeline

    cfg = compressed
    metrics = report(cfg, "quantize.json")
    folder = Path(cfg.paths.tflite)
    assert metrics["failed"] == {}
    assert sorted(metrics["variants"]) == sorted(ALL_VARIANTS)
    frontier = read_csv(Path(cfg.paths.reports) / "frontier.csv")
    assert [r["variant"] for r in frontier] == ALL_VARIANTS  # one row per variant
    assert list(frontier[0]) == ["variant", "accuracy", "agreement", "bytes", "gzip_bytes",
                                 "p50_ms", "p95_ms"]

    x_test, y_test = pipeline.arrays(cfg, pipeline.load_prepared(cfg), "test")
    for name in ALL_VARIANTS:
        path = folder / f"{name}.tflite"
        row = metrics["variants"][name]
        # The kernels the stage ran it on (XNNPACK refuses some INT8 graphs):
        # INT8 results may differ by an image between XNNPACK and the built-ins.
        assert row["kernels"] in ("xnnpack", "builtin")
        resolver = (OpResolverType.AUTO if row["kernels"] == "xnnpack"
                    else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interpreter = Interpreter(model_path=str(path), num_threads=cfg.quantize.threads,
                                  experimental_op_resolver_type=resolver)
        interpreter.allocate_tensors()
        inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
        assert row["bytes"] == path.stat().st_size
        if "int8" in name:
            assert inp["dtype"] == np.int8 and out["dtype"] == np.int8, name
        else:
            assert inp["dtype"] == np.float32 and out["dtype"] == np.float32, name
        if name not in ("pruned_int8", "pruned_int8_sparse", "trained_float32"):
            continue
        # Recompute the accuracy from real predictions, independently of the stage.
        predicted = []
        in_scale, in_zero = inp["quantization"]
        for image in x_test:
            x = image[None]
            if inp["dtype"] == np.int8:
                x = np.clip(np.round(x / in_scale + in_zero), -128, 127).astype(np.int8)
            interpreter.set_tensor(inp["index"], x)
            interpreter.invoke()
            predicted.append(int(np.argmax(interpreter.get_tensor(out["index"])[0])))
        assert row["accuracy"] == pytest.approx(np.mean(np.array(predicted) == y_test), abs=1e-6)
        assert 0.0 <= row["agreement"] <= 1.0 and row["p95_ms"] >= row["p50_ms"] > 0

    # The edge variant: the smallest within the budget of the Keras reference.
    edge = json.loads((folder / EDGE).read_text())
    floor = metrics["reference_accuracy"] - cfg.quantize.accuracy_budget - 1e-9
    eligible = [r for r in frontier if float(r["accuracy"]) >= floor]
    if eligible:
        smallest = min(eligible, key=lambda r: (int(r["bytes"]), -float(r["accuracy"]),
                                                int(r["gzip_bytes"])))
        assert edge["variant"] == smallest["variant"]
    assert edge["within_budget"] == bool(eligible)
    assert metrics["edge_variant"] == edge["variant"] and (folder / edge["file"]).is_file()
    # A 2k-parameter model is mostly flatbuffer overhead: INT8 is smaller, not 4x.
    assert metrics["pruned_int8_vs_float32_bytes"] > 1.1
    # Pruned weights stored sparse in one file only. (Fewer bytes needs bigger
    # kernels than this tiny model's: the index arrays cost more than 2k zeros save.)
    sparse, dense = metrics["variants"]["pruned_int8_sparse"], metrics["variants"]["pruned_int8"]
    assert sparse["sparse_tensors"] > 0 and dense["sparse_tensors"] == 0
    assert metrics["pruned_int8_sparse_vs_float32_bytes"] > 1.0
    assert metrics["qat"]["left_float"] == ["block0_se", "block1_se"]

    (run,) = stage_runs(cfg, "quantize")
    assert run.info.status == "FINISHED" and run.data.tags[TAG_EDGE_VARIANT] == edge["variant"]
    assert run.data.tags["tfmlops.upstream.prune"] == \
        json.loads((Path(cfg.paths.pruned) / RUN_FILE).read_text())["run_id"]
    client = mlflow_client(cfg)
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/frontier.png"}
    # QAT's fine-tune was profiled (a trace of a few steady-state steps)
    assert "profile" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert (folder / FRONTIER_PNG).read_bytes()[:4] == b"\x89PNG"


def assert_one_line_exit_2(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.timeout(120)
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_prune_says_what_it_is_doing(compressed):
    lines = (Path(compressed.paths.prepared).parents[1] / "prune.stderr").read_text()
    for step in ("[1/3] loading the trained model", "[2/3] fine-tuning under the pruning "
                 f"schedule: 3 epoch(s) to sparsity {FINAL_SPARSITY}", "[3/3] stripping"):
        assert f"prune: {step}" in lines, lines[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quantize_says_which_variant_it_is_on(compressed):
    """Nine variants take ~20 s: each one's conversion and evaluation is a log line, k of n."""
    lines = (Path(compressed.paths.prepared).parents[1] / "quantize.stderr").read_text()
    n = len(ALL_VARIANTS)
    for k, name in enumerate(ALL_VARIANTS[:-1], 1):  # the QAT variant converts after its fine-tune
        assert f"quantize: [{k}/{n}] converting {name}" in lines, lines[-3000:]
    assert f"quantize: [{n}/{n}] {ALL_VARIANTS[-1]}: QAT fine-tune" in lines
    evaluated = re.findall(r"quantize: \[(\d+)/(\d+)\] evaluating (\w+)", lines)
    assert sorted(name for _, _, name in evaluated) == sorted(ALL_VARIANTS)
    assert [int(k) for k, _, _ in evaluated] == list(range(1, n + 1))
    assert {int(total) for _, total, _ in evaluated} == {n}


def test_bad_sparsity_and_missing_models_exit_2(tmp_path, prepared_digits):
    shutil.copytree(prepared_digits.paths.prepared, tmp_path / "data" / "prepared")
    write_params(tmp_path, prune={"final_sparsity": 1.0})
    proc = run_cli("prune", cwd=tmp_path, check=False)
    assert_one_line_exit_2(proc, "prune.final_sparsity", "[0.0, 1.0)")

    write_params(tmp_path)
    for stage in ("prune", "quantize"):
        proc = run_cli(stage, cwd=tmp_path, check=False)
        assert_one_line_exit_2(proc, "no trained model", "dvc repro train")
    assert not (tmp_path / "models" / "pruned").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bad_quantize_inputs_exit_2(compressed, tmp_path):
    cfg = compressed
    workdir = Path(cfg.paths.train).parents[1]
    train_images = json.loads(
        (Path(cfg.paths.prepared) / MANIFEST).read_text())["split_counts"]["train"]
    before = sorted(p.name for p in Path(cfg.paths.tflite).iterdir())

    params = tiny_params(workdir, **SECTIONS)
    params["quantize"]["representative_samples"] = train_images + 1
    bad = tmp_path / "too_many.yaml"
    bad.write_text(yaml.safe_dump(params))
    proc = run_cli("--params", str(bad), "quantize", cwd=workdir, check=False)
    assert_one_line_exit_2(proc, "quantize.representative_samples", f"at most {train_images}")

    params = tiny_params(workdir, **SECTIONS)
    params["paths"]["pruned"] = str(tmp_path / "nowhere")
    missing = tmp_path / "no_pruned.yaml"
    missing.write_text(yaml.safe_dump(params))
    proc = run_cli("--params", str(missing), "quantize", cwd=workdir, check=False)
    assert_one_line_exit_2(proc, "no pruned model", "dvc repro prune")
    # Nothing was touched.
    assert sorted(p.name for p in Path(cfg.paths.tflite).iterdir()) == before
