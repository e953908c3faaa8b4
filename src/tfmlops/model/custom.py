"""The project's own Keras pieces, written once for whichever keras is handed.

- `SqueezeExcite`: a channel-attention layer (squeeze-and-excitation) made by
  subclassing the handed module's `Layer`.
- `FocalLoss`: focal loss with label smoothing for imbalanced classes.

Both are registered for serialization under the package `tfmlops`, so
`.keras` files that use them load with `safe_mode=True` once this module is
imported (`custom_objects(keras)` returns them for explicit loading too).
"""

from __future__ import annotations

import functools


@functools.cache
def squeeze_excite_layer(keras):
    """The SqueezeExcite layer class for this keras module."""

    @keras.saving.register_keras_serializable(package="tfmlops", name="SqueezeExcite")
    class SqueezeExcite(keras.layers.Layer):
        def __init__(self, ratio: int = 4, **kwargs):
            super().__init__(**kwargs)
            self.ratio = ratio

        def build(self, input_shape):
            channels = int(input_shape[-1])
            hidden = max(1, channels // self.ratio)
            # The block's own dtype policy: under mixed precision the inner layers must
            # compute in the same dtype as the feature map they scale.
            self.squeeze = keras.layers.Dense(hidden, activation="relu", name="squeeze",
                                              dtype=self.dtype_policy)
            self.excite = keras.layers.Dense(channels, activation="sigmoid", name="excite",
                                             dtype=self.dtype_policy)
            self.squeeze.build((None, channels))
            self.excite.build((None, hidden))
            super().build(input_shape)

        def call(self, inputs):
            pooled = keras.ops.mean(inputs, axis=(1, 2)) if hasattr(keras, "ops") else \
                _tf().reduce_mean(inputs, axis=(1, 2))
            weights = self.excite(self.squeeze(pooled))
            return inputs * weights[:, None, None, :]

        def get_config(self):
            return {**super().get_config(), "ratio": self.ratio}

    return SqueezeExcite


@functools.cache
def focal_loss_class(keras):
    """The FocalLoss class for this keras module (sparse integer labels)."""

    @keras.saving.register_keras_serializable(package="tfmlops", name="FocalLoss")
    class FocalLoss(keras.losses.Loss):
        def __init__(self, gamma: float = 2.0, label_smoothing: float = 0.0, num_classes: int = 10,
                     name: str = "focal_loss", **kwargs):
            super().__init__(name=name, **kwargs)
            self.gamma = gamma
            self.label_smoothing = label_smoothing
            self.num_classes = num_classes

        def call(self, y_true, y_pred):
            tf = _tf()
            y_true = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), self.num_classes)
            y_true = y_true * (1.0 - self.label_smoothing) + self.label_smoothing / self.num_classes
            y_pred = tf.clip_by_value(tf.cast(y_pred, tf.float32), 1e-7, 1.0 - 1e-7)
            weight = tf.pow(1.0 - y_pred, self.gamma)
            return tf.reduce_sum(-y_true * weight * tf.math.log(y_pred), axis=-1)

        def get_config(self):
            return {**super().get_config(), "gamma": self.gamma,
                    "label_smoothing": self.label_smoothing, "num_classes": self.num_classes}

    return FocalLoss


def custom_objects(keras) -> dict:
    return {
        "tfmlops>SqueezeExcite": squeeze_excite_layer(keras),
        "tfmlops>FocalLoss": focal_loss_class(keras),
    }


def _tf():
    import tensorflow as tf

    return tf
