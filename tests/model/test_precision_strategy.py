"""Precision policies and tf.distribute strategies: resolution, mixed steps, replicas."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import child_env
from tfmlops.artifacts import PRECISION
from tfmlops.config import BlockSpec, ModelSpec, OptimizerConfig, replace
from tfmlops.errors import ConfigError
from tfmlops.model.precision import choose_policy
from tfmlops.stages.train.strategy import cluster_tasks, resolve_strategy

TINY = ModelSpec(blocks=[BlockSpec(4, 3, False), BlockSpec(8, 3, False)], convs_per_block=1,
                 head_units=16, dropout=0.0)


def cluster(workers: int, chief: bool = False) -> str:
    spec = {"worker": [f"127.0.0.1:{2000 + i}" for i in range(workers)]}
    if chief:
        spec["chief"] = ["127.0.0.1:1999"]
    return json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize("setting, gpus, expected", [
    ("auto", [], "float32"),                           # these CPUs: no fp16/bf16 units
    ("auto", [(7, 0)], "mixed_float16"),               # Volta and newer: tensor cores
    ("auto", [(8, 6), (9, 0)], "mixed_float16"),
    ("auto", [(6, 1)], "float32"),                     # Pascal: float16 would be slower
    ("auto", [(8, 0), (6, 1)], "float32"),             # mixed fleets take the safe policy
    ("mixed_bfloat16", [], "mixed_bfloat16"),          # explicit settings are kept
    ("float32", [(9, 0)], "float32"),
])
def test_precision_resolution(setting, gpus, expected):
    assert choose_policy(setting, gpus).policy == expected


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    from tfmlops.model.precision import cpu_flags, has_bf16_units

    amd = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t: avx2\n"
    xeon = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
    (tmp_path / "amd").write_text(amd)
    (tmp_path / "xeon").write_text(xeon)
    assert cpu_flags(tmp_path / "amd") == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert not has_bf16_units(cpu_flags(tmp_path / "amd"))
    assert has_bf16_units(cpu_flags(tmp_path / "xeon"))
    assert has_bf16_units({"amx_bf16"}) and has_bf16_units({"avx512_bf16"})
    assert cpu_flags(tmp_path / "missing") == frozenset()  # not Linux: no bf16 claimed


def tiny_batch_and_model(prepared_digits, batch_size=32):
    """A real batch of the prepared digits and a maker of the TINY compiled model."""
    import keras

    from tfmlops.data import pipeline
    from tfmlops.model.builder import build_model
    from tfmlops.model.custom import make_optimizer

    prepared = pipeline.load_prepared(prepared_digits)
    batch = next(iter(pipeline.dataset(prepared_digits, prepared, "train",
                                       batch_size=batch_size, training=True)))

    def make_model():
        model = build_model(TINY, keras, prepared.input_shape, prepared.num_classes)
        model.compile(optimizer=make_optimizer(OptimizerConfig(), 1e-3, keras),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return batch, make_model


@pytest.mark.slow  # trains
@pytest.mark.timeout(300)
def test_timing_trains_both_policies_and_picks_the_faster(prepared_digits):
    import keras

    from tfmlops.model.precision import faster, time_policies

    batch, make_model = tiny_batch_and_model(prepared_digits)
    built = []

    def tracked():
        built.append(keras.mixed_precision.global_policy().name)
        return make_model()

    timings = time_policies(tracked, batch, keras, warmup=1, steps=3)
    assert built == ["float32", "mixed_bfloat16"]  # each built under its own policy
    assert set(timings) == {"float32", "mixed_bfloat16"}
    assert all(v > 0 and np.isfinite(v) for v in timings.values())
    assert faster(timings) == max(timings, key=timings.get)
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    assert faster({"float32": 100.0, "mixed_bfloat16": 100.0}) == "float32"  # a tie
    assert faster({"float32": 100.0, "mixed_bfloat16": 250.0}) == "mixed_bfloat16"
    # a margin: bf16 must be faster by more than it, else float32 stays
    assert faster({"float32": 731.0, "mixed_bfloat16": 732.0}, margin=0.1) == "float32"
    assert faster({"float32": 100.0, "mixed_bfloat16": 110.0}, margin=0.1) == "float32"
    assert faster({"float32": 100.0, "mixed_bfloat16": 110.5}, margin=0.1) == "mixed_bfloat16"


AVX2 = frozenset({"sse2", "avx", "avx2", "fma"})
SEPARABLE = ModelSpec(blocks=[BlockSpec(4, 3, True)], convs_per_block=1, head_units=16)


@pytest.mark.parametrize("flags, spec, expected, reason", [
    (AVX2, TINY, "float32", "no-bf16-units"),
    (AVX2 | {"avx512_bf16"}, TINY, "float32", "no-amx"),  # 1.14x on the digits CNN: not worth it
    (AVX2 | {"avx512_bf16", "amx_bf16"}, TINY, "mixed_bfloat16", "amx-dense"),
    (AVX2 | {"amx_bf16"}, SEPARABLE, "float32", "depthwise"),
    (AVX2 | {"amx_bf16"}, ModelSpec(backbone="mobilenet_v3_small"), "float32", "depthwise"),
    (AVX2 | {"amx_bf16"}, ModelSpec(backbone="resnet50"), "mixed_bfloat16", "amx-dense"),
])
def test_auto_is_decided_from_the_cpu_and_the_architecture_never_timed(flags, spec, expected,
                                                                      reason):
    from tfmlops.model import precision

    def measure():
        raise AssertionError("auto must not time")

    decision = precision.choose_policy("auto", [], flags, measure, spec=spec)
    assert (decision.policy, decision.reason) == (expected, reason)
    assert decision.images_per_s == {}
    assert precision.choose_policy("auto", [(8, 0)], flags, measure, spec=spec).policy == "mixed_float16"


@pytest.mark.slow  # trains
@pytest.mark.timeout(300)
def test_timed_is_timed_only_on_cpus_with_bf16_units(prepared_digits, tmp_path):
    import keras

    from tfmlops.model import precision

    batch, make_model = tiny_batch_and_model(prepared_digits)
    calls = []

    def measure():
        calls.append(1)
        return precision.time_policies(make_model, batch, keras, warmup=1, steps=2)

    avx2 = set(AVX2)
    assert precision.choose_policy("timed", [], avx2, measure).policy == "float32"
    assert precision.choose_policy("timed", [], avx2, measure).reason == "no-bf16-units"
    assert calls == []  # no bf16 units: nothing is timed
    assert precision.choose_policy("timed", [(8, 0)], avx2 | {"amx_bf16"},
                            measure).policy == "mixed_float16"  # a GPU decides
    assert precision.choose_policy("float32", [], {"amx_bf16"}, measure).policy == "float32"
    assert precision.choose_policy("auto", [], avx2 | {"avx512_bf16"}, measure).reason == "no-amx"
    assert calls == []

    decision = precision.choose_policy("timed", [], avx2 | {"avx512_bf16"}, measure, margin=0.25)
    assert calls == [1] and decision.reason == "timed"
    assert set(decision.images_per_s) == {"float32", "mixed_bfloat16"}
    assert decision.policy == precision.faster(decision.images_per_s, 0.25)
    params, metrics = decision.mlflow()
    assert params == {"precision_policy": decision.policy, "precision_reason": "timed",
                      "precision_margin": 0.25}
    assert set(metrics) == {"precision_float32_images_per_s",
                            "precision_mixed_bfloat16_images_per_s"}
    line = decision.line("timed")
    assert decision.policy in line and "images/s" in line and "more than 25% faster" in line
    assert precision.choose_policy("timed", [], {"avx512_bf16"}, None).policy == "float32"  # untimed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_decision_is_timed_once_per_architecture(prepared_digits, tmp_path):
    """What tune's trials and final round share: the train stage's own timing of the
    actual model (model/fitting.choose_precision), kept in the tuner folder's file."""
    from tfmlops.data import pipeline
    from tfmlops.model import fitting, precision

    prepared = pipeline.load_prepared(prepared_digits)
    auto = prepared_digits
    prepared_digits = replace(
        auto, train=replace(auto.train, precision="timed"))
    cache = tmp_path / PRECISION
    bf16 = {"avx2", "amx_bf16"}
    first = fitting.choose_precision(prepared_digits, prepared, 32, cache_file=cache, flags=bf16)
    margin = prepared_digits.train.precision_margin
    assert first.reason == "timed" and first.margin == margin
    assert first.policy == precision.faster(first.images_per_s, margin)
    stored = json.loads(cache.read_text())
    assert [v["policy"] for v in stored.values()] == [first.policy]
    again = fitting.choose_precision(prepared_digits, prepared, 32, cache_file=cache, flags=bf16)
    assert again == first  # the in-process memo
    precision._decided.clear()  # another process of the same tune: the file
    assert fitting.choose_precision(prepared_digits, prepared, 32, cache_file=cache,
                                flags=bf16) == first
    other_batch = fitting.choose_precision(prepared_digits, prepared, 16, cache_file=cache,
                                       flags=bf16)
    assert other_batch.reason == "timed" and len(json.loads(cache.read_text())) == 2
    # train reads tune's copy without writing into it (paths.tuned is tune's output).
    precision._decided.clear()
    read_only = tmp_path / "tuned" / PRECISION
    read_only.parent.mkdir()
    read_only.write_text(cache.read_text())
    assert fitting.choose_precision(prepared_digits, prepared, 32, cache_file=read_only, write=False,
                                flags=bf16) == first
    precision._decided.clear()
    missing = tmp_path / "untuned" / PRECISION
    assert fitting.choose_precision(prepared_digits, prepared, 32, cache_file=missing, write=False,
                                flags=bf16).reason == "timed"
    assert not missing.exists()
    here = fitting.choose_precision(prepared_digits, prepared, 32)  # this machine's own flags
    if not precision.has_bf16_units(precision.cpu_flags()):
        assert (here.policy, here.reason) == ("float32", "no-bf16-units")
    # auto, on any machine: no timing, nothing written
    precision._decided.clear()
    untimed = tmp_path / "auto" / PRECISION
    assert fitting.choose_precision(auto, prepared, 32, cache_file=untimed,
                                flags=bf16).reason == "amx-dense"
    assert not untimed.exists()


@pytest.mark.parametrize("setting, tf_config, gpus, expected", [
    ("auto", None, 0, "default"),
    ("auto", None, 1, "default"),
    ("auto", None, 2, "mirrored"),
    ("auto", cluster(2), 0, "multi_worker"),
    ("auto", cluster(1, chief=True), 0, "multi_worker"),
    ("auto", cluster(1), 4, "mirrored"),               # a one-task cluster is one machine
    ("mirrored", None, 0, "mirrored"),                 # explicit: CPU split into replicas
    ("default", cluster(3), 0, "default"),
])
def test_strategy_resolution(setting, tf_config, gpus, expected):
    assert resolve_strategy(setting, tf_config, gpus) == expected


def test_bad_tf_config_is_a_config_error():
    assert cluster_tasks(None) == 0
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        cluster_tasks("{not json")


def test_logical_cpus_cannot_be_added_once_tensorflow_runs():
    import tensorflow as tf

    from tfmlops.stages.train.strategy import prepare_devices

    tf.constant(1.0) + 1.0  # devices are initialised from here on
    with pytest.raises(ConfigError, match="fresh process"):
        prepare_devices("mirrored", 8)
    prepare_devices("default", 8)  # nothing to do, no error


@pytest.mark.parametrize("policy, compute", [("mixed_float16", "float16"),
                                             ("mixed_bfloat16", "bfloat16")])
def test_one_mixed_precision_training_step(policy, compute):
    import keras

    from tfmlops.model.builder import build_model
    from tfmlops.model.custom import make_optimizer
    from tfmlops.model.precision import global_policy, uses_loss_scaling

    with global_policy(policy, keras):
        model = build_model(TINY, keras, (16, 16, 1), 10)
        model.compile(optimizer=make_optimizer(OptimizerConfig(), 1e-3, keras),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    conv = model.get_layer("block0_conv0")
    assert (conv.compute_dtype, conv.variable_dtype) == (compute, "float32")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 16, 16, 1)).astype("float32")
    y = rng.integers(0, 10, 16)
    before = [w.copy() for w in model.get_weights()]
    logs = model.train_on_batch(x, y, return_dict=True)
    assert np.isfinite(logs["loss"])
    assert model(x).dtype == "float32"  # the softmax computes in float32
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert uses_loss_scaling(model, keras) is (policy == "mixed_float16")
    if policy == "mixed_float16":
        assert float(model.optimizer.dynamic_scale) > 1.0


MIRRORED_ONE_STEP = textwrap.dedent("""
    import json
    import numpy as np
    from tfmlops.stages.train import strategy as dist

    dist.prepare_devices("mirrored", 2)  # first: before TensorFlow initialises devices
    import keras
    import tensorflow as tf
    from tfmlops.config import BlockSpec, ModelSpec
    from tfmlops.model.builder import build_model

    # No batch norm and no dropout: per-replica batch statistics and random
    # masks are the legitimate differences between 1 and 2 replicas.
    spec = ModelSpec(blocks=[BlockSpec(4, 3, False), BlockSpec(8, 3, False)],
                     convs_per_block=1, batch_norm=False, dropout=0.0, head_units=16)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16, 16, 1)).astype("float32")
    y = rng.integers(0, 10, 32)
    initial = build_model(spec, keras, (16, 16, 1), 10).get_weights()

    def one_step(kind, replicas):
        strategy = dist.make_strategy(kind, replicas)
        with strategy.scope():
            model = build_model(spec, keras, (16, 16, 1), 10)
            model.compile(optimizer=keras.optimizers.SGD(0.5),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.set_weights(initial)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # one global batch
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        return strategy.num_replicas_in_sync, model.get_weights()

    n1, single = one_step("default", 1)
    n2, mirrored = one_step("mirrored", 2)
    print(json.dumps({
        "replicas": [n1, n2],
        "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(single, mirrored)),
        "moved": max(float(np.abs(a - b).max()) for a, b in zip(single, initial)),
    }))
""")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_mirrored_two_cpu_replicas_match_one_replica_for_one_step():
    proc = subprocess.run([sys.executable, "-c", MIRRORED_ONE_STEP], capture_output=True,
                          text=True, timeout=170, env={**child_env(), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas"] == [1, 2]
    assert result["moved"] > 1e-3  # the step really changed the weights
    assert result["max_diff"] < 1e-5


@pytest.mark.parametrize("setting, expected", [("mixed_bfloat16", "mixed_bfloat16"),
                                               ("auto", None), ("timed", None)])
def test_tune_trials_are_built_under_trains_policy(prepared_digits, make_cfg,
                                                   setting, expected):
    import keras_tuner as kt

    from tfmlops.data import pipeline
    from tfmlops.model import precision
    from tfmlops.stages.tune import search_space
    from tfmlops.stages.tune.hypermodel import TrialModel

    cfg = make_cfg(train={"precision": setting})
    hypermodel = TrialModel(cfg, pipeline.load_prepared(prepared_digits), deadline=1e12)
    model = hypermodel.build(kt.HyperParameters())
    cache = Path(cfg.paths.tuner) / PRECISION
    if setting == "timed" and precision.has_bf16_units(precision.cpu_flags()):
        (stored,) = json.loads(cache.read_text()).values()  # timed once, kept for the tune
        expected = stored["policy"]
    elif setting == "timed":
        expected = "float32"
        assert not cache.exists()  # nothing timed, nothing kept
    elif setting == "auto":  # from this host's devices and the trial's architecture
        spec = search_space.config_from_values(
            cfg, search_space.declare(kt.HyperParameters(), cfg.tune.space)).model
        expected = precision.choose_policy("auto", precision.gpu_capabilities(), precision.cpu_flags(),
                                    spec=spec).policy
        assert not cache.exists()  # never timed, nothing kept
    assert model.get_layer("block0_conv0").dtype_policy.name == expected
    assert model.get_layer("probabilities").dtype_policy.compute_dtype == "float32"
