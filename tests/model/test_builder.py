"""The one builder: same spec, same weights, same outputs in Keras 3 and tf_keras."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from tfmlops.artifacts import MODEL_FILE
from tfmlops.config import BlockSpec, ModelSpec
from tfmlops.errors import ConfigError

INPUT = (16, 16, 1)
SPECS = {
    "conv_bn": ModelSpec(blocks=[BlockSpec(8, 3, False), BlockSpec(16, 3, False)],
                         convs_per_block=1, head_units=32, dropout=0.1),
    "separable_se_avg": ModelSpec(blocks=[BlockSpec(8, 3, True), BlockSpec(16, 5, True)],
                                  convs_per_block=2, batch_norm=False, pooling="avg",
                                  head_units=0, activation="swish", squeeze_excite=True),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_keras3_and_tf_keras_agree_after_weight_copy(name):
    import keras
    import tf_keras

    from tfmlops.model.builder import build_model

    spec = SPECS[name]
    k3 = build_model(spec, keras, INPUT, 10)
    k2 = build_model(spec, tf_keras, INPUT, 10)
    assert [w.shape for w in k3.get_weights()] == [w.shape for w in k2.get_weights()]
    # Non-default weights everywhere (BN statistics included), so a misordered copy shows.
    rng = np.random.default_rng(0)
    weights = [rng.normal(0.5, 0.2, w.shape).astype(w.dtype) for w in k3.get_weights()]
    k3.set_weights(weights)
    k2.set_weights(k3.get_weights())
    x = rng.normal(size=(8, *INPUT)).astype("float32")
    out3 = k3(x, training=False).numpy()
    out2 = k2(x, training=False).numpy()
    assert out3.shape == (8, 10)
    np.testing.assert_allclose(out3, out2, atol=1e-5)
    assert k3.layers[-1].dtype_policy.compute_dtype == "float32"


def test_custom_layer_and_loss_round_trip_with_safe_mode(tmp_path):
    import keras

    from tfmlops.config import LossConfig
    from tfmlops.model.builder import build_model
    from tfmlops.model.custom import make_loss
    from tfmlops.model.trained import load_keras3

    model = build_model(SPECS["separable_se_avg"], keras, INPUT, 10)
    model.compile(optimizer="adam", loss=make_loss(LossConfig(name="focal", label_smoothing=0.1),
                                                   10, keras), metrics=["accuracy"])
    path = tmp_path / MODEL_FILE
    model.save(path)
    loaded = load_keras3(path)
    x = np.random.default_rng(1).normal(size=(4, *INPUT)).astype("float32")
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
    assert any(type(layer).__name__ == "SqueezeExcite" for layer in loaded.layers)
    assert type(loaded.loss).__name__ == "FocalLoss"


def test_spec_with_more_pooling_than_the_input_allows_fails_before_building():
    import keras

    from tfmlops.model.builder import build_model

    spec = ModelSpec(blocks=[BlockSpec(4, 3, False)] * 6)  # 5 pools of a 16px input
    with pytest.raises(ConfigError, match="model.blocks"):
        build_model(spec, keras, INPUT, 10)


def test_squeeze_excite_under_mixed_float16_saves_and_loads(tmp_path):
    import keras

    from tfmlops.model.builder import build_model
    from tfmlops.model.trained import load_keras3

    spec = ModelSpec(squeeze_excite=True, blocks=[BlockSpec(8, 3, False), BlockSpec(16, 3, True)])
    x = np.random.default_rng(0).random((2, 16, 16, 1), dtype=np.float32)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model(spec, keras, (16, 16, 1), 10)
        expected = model(x).numpy()
        model.save(tmp_path / "se.keras")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert expected.dtype == np.float32
    np.testing.assert_allclose(load_keras3(tmp_path / "se.keras")(x).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_fused_batch_norm_computes_keras_own_batch_norm(policy, tmp_path):
    """The builder's Keras 3 batch norm runs TensorFlow's fused kernel and computes what
    Keras' own layer does: the training step's outputs, gradients and moving statistics,
    inference; the model saves as stock BatchNormalization and loads without tfmlops."""
    import keras
    import tensorflow as tf
    import tf_keras

    from tfmlops.model.builder import build_model
    from tfmlops.model.custom import _fused_batch_norm_call

    spec = msgspec.structs.replace(SPECS["conv_bn"], dropout=0.0)  # no random masks to differ
    keras.utils.set_random_seed(0)  # the same initial weights every run
    keras.mixed_precision.set_global_policy(policy)
    try:
        fused = build_model(spec, keras, INPUT, 10)
        stock = keras.models.clone_model(fused)  # from its config: every layer Keras' own
        stock.set_weights(fused.get_weights())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    bn = [layer for layer in fused.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(bn) == 2 and all(layer.call.__func__ is _fused_batch_norm_call for layer in bn)
    tf_keras_model = build_model(spec, tf_keras, INPUT, 10)  # fuses on its own
    for plain in (stock, tf_keras_model):
        assert all(getattr(layer.call, "__func__", None) is not _fused_batch_norm_call
                   for layer in plain.layers)

    # batch 4 of 16 and 8 px: few values per channel, so a moving variance averaged without
    # the kernel's Bessel correction undone (n / (n - 1)) is off by 1e-3 and shows
    x = tf.constant(np.random.default_rng(2).normal(1.0, 2.0, (4, *INPUT)).astype("float32"))
    results = []
    for model in (stock, fused):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.range(10, dtype=tf.float32))
        grads = tape.gradient(loss, model.trainable_weights)
        results.append((out.numpy(), [g.numpy() for g in grads],
                        [w.numpy() for w in model.non_trainable_weights],
                        model(x, training=False).numpy()))
    (out_s, grads_s, stats_s, inf_s), (out_f, grads_f, stats_f, inf_f) = results
    tol = {"rtol": 1e-4, "atol": 1e-5} if policy == "float32" else {"rtol": 2e-2, "atol": 2e-2}
    np.testing.assert_allclose(out_f, out_s, **tol)
    # float rounding in a gradient scales with the largest of them, not with its own tensor's:
    # a batch norm's beta gradient is a small difference of large sums
    scale = max(float(np.abs(g).max()) for g in grads_s)
    for g_f, g_s in zip(grads_f, grads_s, strict=True):
        np.testing.assert_allclose(g_f, g_s, rtol=tol["rtol"], atol=tol["atol"] * scale)
    for s_f, s_s in zip(stats_f, stats_s, strict=True):
        np.testing.assert_allclose(s_f, s_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inf_f, inf_s, **tol)

    fused.save(tmp_path / "fused.keras")
    loaded = keras.models.load_model(tmp_path / "fused.keras")  # no custom objects
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in stock.layers]
    np.testing.assert_allclose(loaded(x, training=False).numpy(), inf_f, **tol)
