"""The project's own Keras pieces, written once for whichever keras is handed, and
the optimizers, learning-rate schedules and losses params choose.

- `SqueezeExcite`: a channel-attention layer (squeeze-and-excitation) made by
  subclassing the handed module's `Layer`.
- `FocalLoss`: focal loss with label smoothing for imbalanced classes.

Both are registered for serialization under the package `tfmlops`, so
`.keras` files that use them load with `safe_mode=True` once this module is
imported (`custom_objects(keras)` returns them for explicit loading too).
"""

from __future__ import annotations

import functools

from tfmlops.config import LossConfig, OptimizerConfig, ScheduleConfig


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
            import tensorflow as tf

            pooled = keras.ops.mean(inputs, axis=(1, 2)) if hasattr(keras, "ops") else \
                tf.reduce_mean(inputs, axis=(1, 2))
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
            self.gamma, self.label_smoothing, self.num_classes = gamma, label_smoothing, num_classes

        def call(self, y_true, y_pred):
            import tensorflow as tf

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
    return {"tfmlops>SqueezeExcite": squeeze_excite_layer(keras),
            "tfmlops>FocalLoss": focal_loss_class(keras)}


def make_schedule(s: ScheduleConfig, learning_rate: float, total_steps: int, keras):
    """A float for `constant` (so ReduceLROnPlateau can change it), else a schedule."""
    sched = keras.optimizers.schedules
    total_steps = max(int(total_steps), 1)
    if s.name == "constant":
        return learning_rate
    if s.name == "exponential_decay":
        # decay_rate is the factor reached at the end of training
        return sched.ExponentialDecay(learning_rate, decay_steps=total_steps, decay_rate=s.decay_rate)
    if s.name == "cosine_decay":
        return sched.CosineDecay(learning_rate, decay_steps=total_steps, alpha=s.alpha)
    if s.name == "cosine_warmup":
        warmup = int(s.warmup_fraction * total_steps)
        return sched.CosineDecay(
            initial_learning_rate=learning_rate * 0.01 if warmup else learning_rate,
            decay_steps=max(total_steps - warmup, 1), alpha=s.alpha,
            warmup_target=learning_rate if warmup else None, warmup_steps=warmup)
    if s.name == "piecewise_constant":
        boundaries = [max(1, int(b * total_steps)) for b in s.boundaries]
        return sched.PiecewiseConstantDecay(boundaries, [learning_rate * f for f in s.factors])
    raise ValueError(f"unknown schedule {s.name}")


def make_optimizer(o: OptimizerConfig, learning_rate, keras):
    opt = keras.optimizers
    common = {"learning_rate": learning_rate}
    if o.clipnorm:
        common["clipnorm"] = o.clipnorm
    if o.name == "adam":
        return opt.Adam(**common)
    if o.name == "adamw":
        return opt.AdamW(weight_decay=o.weight_decay, **common)
    if o.name == "rmsprop":
        return opt.RMSprop(momentum=o.momentum, **common)
    if o.name == "sgd":
        return opt.SGD(momentum=o.momentum, nesterov=True, **common)
    if o.name == "lamb":
        return opt.Lamb(weight_decay=o.weight_decay, **common)
    raise ValueError(f"unknown optimizer {o.name}")


def make_loss(loss: LossConfig, num_classes: int, keras):
    if loss.name == "focal" or loss.label_smoothing:
        # label smoothing needs one-hot targets; CategoricalCrossentropy on sparse
        # labels would not apply: use the focal class with gamma 0 (= smoothed CE).
        gamma = loss.gamma if loss.name == "focal" else 0.0
        return focal_loss_class(keras)(gamma=gamma, label_smoothing=loss.label_smoothing,
                                       num_classes=num_classes)
    return keras.losses.SparseCategoricalCrossentropy()
