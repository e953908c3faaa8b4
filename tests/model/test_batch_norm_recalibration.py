"""prune's BatchNorm re-estimation (compress.pruning.recalibrated_batch_norm): after it,
every BatchNormalization layer's moving mean and variance are the exact statistics of
that layer's input over the given images, in the recalibrated model itself (a later
layer's input passes the earlier layers' new statistics), in a copy; the model given is
left as it was."""

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)


def test_moving_statistics_become_the_inputs_exact_statistics():
    from tfmlops.compress.source import tf_keras_module
    from tfmlops.stages.prune.pruning import recalibrated_batch_norm

    keras = tf_keras_module()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, name="conv"), keras.layers.BatchNormalization(name="bn1"),
        keras.layers.ReLU(), keras.layers.Flatten(),
        keras.layers.Dense(6, name="dense"), keras.layers.BatchNormalization(name="bn2"),
    ])
    for bn in ("bn1", "bn2"):  # stale statistics, as pruning leaves them
        layer = model.get_layer(bn)
        layer.moving_mean.assign(np.full(layer.moving_mean.shape, 5.0, np.float32))
        layer.moving_variance.assign(np.full(layer.moving_variance.shape, 9.0, np.float32))
    before = [w.copy() for w in model.get_weights()]
    images = np.random.default_rng(1).normal(2.0, 3.0, (300, 8, 8, 1)).astype(np.float32)

    fixed = recalibrated_batch_norm(model, images, keras)

    for bn, axes in (("bn1", (0, 1, 2)), ("bn2", (0,))):
        # its input in the recalibrated model (bn2's input passes the recalibrated bn1)
        acts = keras.Model(fixed.inputs, fixed.get_layer(bn).input).predict(images, verbose=0)
        layer = fixed.get_layer(bn)
        np.testing.assert_allclose(layer.moving_mean.numpy(), acts.mean(axis=axes), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.moving_variance.numpy(), acts.var(axis=axes), rtol=1e-4,
                                   atol=1e-5)
    for got, want in zip(model.get_weights(), before, strict=True):  # the original unchanged
        np.testing.assert_array_equal(got, want)
    # every other weight carried over
    for name in ("conv", "dense"):
        for got, want in zip(fixed.get_layer(name).get_weights(), model.get_layer(name).get_weights(),
                             strict=True):
            np.testing.assert_array_equal(got, want)
