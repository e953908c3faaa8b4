"""Pure compression helpers: the pruning steps, sparsity tables, gzip sizes, the edge pick."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest

from tfmlops.compress.measure import gzip_bytes, sparsity_table, zero_fraction
from tfmlops.config import ConfigError, PruneConfig, config_from_dict
from tfmlops.stages.prune.pruning import pruning_steps
from tfmlops.stages.quantize.frontier import required_names, select_edge, variants


def tfmot_update_steps(steps) -> list[int]:
    """The steps at which tfmot's PolynomialDecay updates the masks (steps count from 1)."""
    return [s for s in range(1, steps.total_steps + 1)
            if steps.begin_step <= s <= steps.end_step
            and (s - steps.begin_step) % steps.frequency == 0]


@pytest.mark.parametrize(
    "epochs, examples, batch, begin, end, frequency",
    [(6, 1270, 64, 0.0, 0.7, 20), (1, 1270, 32, 0.0, 0.7, 20), (1, 100, 64, 0.0, 0.7, 20),
     (3, 999, 10, 0.25, 0.9, 7), (2, 50, 50, 0.5, 1.0, 100)],
)
def test_pruning_steps_reach_final_sparsity_inside_training(epochs, examples, batch, begin, end,
                                                            frequency):
    p = PruneConfig(epochs=epochs, begin_fraction=begin, end_fraction=end, frequency=frequency)
    steps = pruning_steps(p, examples, batch)
    assert steps.steps_per_epoch == -(-examples // batch)
    assert steps.total_steps == epochs * steps.steps_per_epoch
    updates = tfmot_update_steps(steps)
    # The last mask update happens exactly at end_step (where sparsity is final),
    # within the fine-tuning, and not after the fraction params asked for.
    assert updates and updates[-1] == steps.end_step <= steps.total_steps
    assert steps.end_step <= max(round(end * steps.total_steps), steps.begin_step + 1)
    assert steps.begin_step == min(int(begin * steps.total_steps), steps.total_steps - 1)
    assert 1 <= steps.frequency <= frequency


def test_pruning_steps_default_params():
    p = PruneConfig()
    steps = pruning_steps(p, 1270, 64)  # the digits train split, default batch
    assert (steps.steps_per_epoch, steps.total_steps) == (20, 20 * p.epochs)
    assert steps.frequency == p.frequency and steps.begin_step == 0
    assert steps.end_step == round(p.end_fraction * steps.total_steps) // p.frequency * p.frequency


def test_sparsity_table_counts_zeros_of_pruned_weights_only():
    kernel = np.array([[0.0, 1.0], [0.0, 0.0]])  # 3 of 4 zero
    bias = np.zeros(2)  # not pruned: its zeros do not count as sparsity of the layer
    bn = [np.ones(3), np.zeros(3)]
    rows, overall = sparsity_table([
        ("conv", [kernel, bias], [kernel]),
        ("bn", bn, []),
        ("pool", [], []),
    ])
    assert rows == [
        {"layer": "conv", "sparsity": 0.75, "params": 6, "prunable": True},
        {"layer": "bn", "sparsity": 0.5, "params": 6, "prunable": False},
    ]
    assert overall["sparsity"] == 0.75
    assert overall["sparsity_all_weights"] == round(8 / 12, 6)
    assert (overall["pruned_params"], overall["params"]) == (4, 12)
    assert zero_fraction([]) == 0.0


def test_gzip_bytes_of_a_file_and_of_bytes(tmp_path):
    data = bytes(10_000) + np.random.default_rng(0).bytes(1000)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert gzip_bytes(path) == gzip_bytes(data) == len(gzip.compress(data, 9, mtime=0))
    assert gzip_bytes(data) < 1200  # zeros compress away, random bytes do not


def row(variant, accuracy, size, p50=1.0):
    return {"variant": variant, "accuracy": accuracy, "bytes": size, "gzip_bytes": size // 2,
            "p50_ms": p50}


def test_edge_is_the_smallest_variant_within_budget():
    rows = [row("trained_float32", 0.99, 1000), row("pruned_int8", 0.982, 300),
            row("pruned_dynamic", 0.985, 350), row("trained_int8", 0.95, 250)]
    edge = select_edge(rows, reference_accuracy=0.99, budget=0.01)
    assert edge["variant"] == "pruned_int8" and edge["file"] == "pruned_int8.tflite"
    assert edge["within_budget"] is True and edge["bytes"] == 300
    # equal raw bytes (pruning keeps the size): the more accurate, then the smaller gzip
    tied = [row("trained_int8", 0.985, 300), row("pruned_int8", 0.985, 300)]
    tied[1]["gzip_bytes"] = 100
    assert select_edge(tied, 0.99, 0.01)["variant"] == "pruned_int8"
    # the budget is inclusive: exactly one point lost still qualifies
    assert select_edge([row("a", 0.98, 10)], 0.99, 0.01)["within_budget"] is True


def test_fastest_edge_trades_bytes_for_latency_within_the_budget():
    rows = [row("pruned_int8_sparse", 0.99, 50, p50=0.25), row("pruned_int8", 0.99, 90, p50=0.07),
            row("trained_int8", 0.97, 90, p50=0.05)]  # fastest, but out of budget
    assert select_edge(rows, 0.99, 0.01)["variant"] == "pruned_int8_sparse"
    fastest = select_edge(rows, 0.99, 0.01, pick="fastest")
    assert fastest["variant"] == "pruned_int8" and fastest["p50_ms"] == 0.07


def test_edge_without_a_variant_in_budget_is_the_most_accurate():
    rows = [row("a", 0.90, 100), row("b", 0.93, 500), row("c", 0.93, 400)]
    edge = select_edge(rows, reference_accuracy=0.99, budget=0.01)
    assert edge["variant"] == "c" and edge["within_budget"] is False
    with pytest.raises(ValueError):
        select_edge([], 0.99, 0.01)


def test_required_variants_name_the_pruned_model():
    assert required_names(["int8", "qat_int8"]) == ["pruned_int8", "pruned_qat_int8"]
    assert required_names(["int8_sparse"]) == ["pruned_int8_sparse"]


def test_sparse_encoding_is_built_for_the_pruned_model_only():
    assert variants("pruned") == ("float32", "dynamic", "float16", "int8", "int8_sparse")
    assert variants("trained") == ("float32", "dynamic", "float16", "int8")


def test_quantize_variants_choose_what_is_converted_in_frontier_order():
    assert variants("pruned", ["int8", "float32", "int8_sparse"]) == ("float32", "int8", "int8_sparse")
    assert variants("trained", ["int8_sparse", "int8"]) == ("int8",)


@pytest.mark.parametrize("section, message", [
    ({"prune": {"final_sparsity": 1.0}}, "prune.final_sparsity: 1.0 is out of range"),
    ({"prune": {"final_sparsity": -0.1}}, "prune.final_sparsity: -0.1 is out of range"),
    ({"quantize": {"required": ["qat_int8"]}}, "quantize.required: lists qat_int8 but"),
    ({"quantize": {"required": ["int4"]}}, "'int4' is not a variant"),
    ({"quantize": {"variants": ["int4"]}}, "quantize.variants: 'int4' is not a converted variant"),
    ({"quantize": {"variants": ["qat_int8"]}}, "'qat_int8' is not a converted variant"),
    ({"quantize": {"variants": []}}, "quantize.variants: empty"),
    ({"quantize": {"variants": ["float32"]}},
     "quantize.required: lists int8 but quantize.variants does not build it"),
])
def test_bad_compression_params_fail_at_load(section, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict(section)


@pytest.mark.timeout(300)
def test_int8_and_float16_conversions_shrink_weights_4x_and_2x():
    """BENCHMARKS' 4x (INT8) and 2x (float16) hold where weights dominate the file: a
    264k-weight model converted by quantize's own `convert` (the pipeline's tiny test
    models are mostly flatbuffer overhead, so their ratios say little)."""
    from tfmlops.compress.source import tf_keras_module
    from tfmlops.stages.quantize.tflite import convert

    keras = tf_keras_module()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    calibration = np.random.default_rng(0).normal(size=(32, 16, 16, 1)).astype(np.float32)
    sizes = {v: len(convert(model, v, calibration)) for v in ("float32", "float16", "int8")}
    assert sizes["float32"] / sizes["int8"] >= 3.8, sizes
    assert sizes["float32"] / sizes["float16"] >= 1.9, sizes


@pytest.mark.timeout(300)
def test_variants_converted_from_one_saved_model_are_the_keras_paths_bytes():
    """quantize saves each source once (`converter_of`) instead of once per variant, as
    `TFLiteConverter.from_keras_model` does: every variant's file must stay byte-identical
    to the Keras path's (its conversion metadata included)."""
    import tensorflow as tf

    from tfmlops.compress.source import tf_keras_module
    from tfmlops.stages.quantize.tflite import _convert, converter_of

    keras = tf_keras_module()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    calibration = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype(np.float32)
    with converter_of(model) as to_tflite:
        for variant in ("float32", "int8"):
            keras_path = _convert(tf.lite.TFLiteConverter.from_keras_model(model), variant,
                                  calibration)
            assert to_tflite(variant, calibration) == keras_path, variant
