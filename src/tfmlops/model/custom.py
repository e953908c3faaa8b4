"""The project's own Keras pieces, written once for whichever keras is handed, and
the optimizers, learning-rate schedules and losses params choose.

- `SqueezeExcite`: a channel-attention layer (squeeze-and-excitation) made by
  subclassing the handed module's `Layer`.
- `FocalLoss`: focal loss with label smoothing for imbalanced classes.
- `fuse_batch_norm`: Keras 3's BatchNormalization layers computed by TensorFlow's fused
  kernel (the layers stay stock BatchNormalization).

SqueezeExcite and FocalLoss are registered for serialization under the package `tfmlops`, so
`.keras` files that use them load with `safe_mode=True` once this module is
imported (`custom_objects(keras)` returns them for explicit loading too).
"""

from __future__ import annotations

import functools
import types

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


# TensorFlow's fused kernel clamps a smaller epsilon up to this (nn_impl.fused_batch_norm).
FUSED_MIN_EPSILON = 1.001e-5


def fuse_batch_norm(model, keras):
    """`model` with each BatchNormalization that the fused kernel can compute as Keras does
    computed by it (FusedBatchNormV3, what tf_keras uses): Keras 3 (3.15) builds batch norm
    from separate ops on the TensorFlow backend, a large share of a fit's step on CPUs for the
    default model (benchmarks/batch_norm.py, best of 7 alternated rounds: a fit's epoch
    0.85x on digits, 0.54x on 96 px photos). The same function up to float rounding: batch
    statistics and the moving-average update as Keras computes them (population variance),
    inference from the moving ones.

    The method is replaced on each layer, not the class: a subclass would be saved under its
    own name, and every `.keras` file would then need tfmlops to load. Layers it cannot
    compute the same (masks, renorm, synchronized, not NHWC, no scale or center, an epsilon
    the kernel would clamp) and tf_keras or other backends (they fuse on their own, or have
    no such kernel) are left as they are."""
    if keras.__name__ != "keras" or keras.backend.backend() != "tensorflow":
        return model
    for layer in model.layers:
        if isinstance(layer, keras.Model):  # a backbone nested as one layer
            fuse_batch_norm(layer, keras)
        elif _fusable(layer, keras):
            layer.call = types.MethodType(_fused_batch_norm_call, layer)
    return model


def _fusable(layer, keras) -> bool:
    if not isinstance(layer, keras.layers.BatchNormalization):
        return False
    ndim = getattr(layer.input_spec, "ndim", None)  # set when the layer was built
    return (ndim == 4 and layer.axis % ndim == 3 and layer.center and layer.scale
            and not layer.renorm and not layer.synchronized
            and layer.epsilon >= FUSED_MIN_EPSILON)


def _fused_batch_norm_call(self, inputs, training=None, mask=None):
    import tensorflow as tf

    if mask is not None:  # never for images; Keras' own path masks the statistics
        return type(self).call(self, inputs, training=training, mask=mask)
    x = tf.cast(inputs, tf.float32)  # Keras computes batch norm in float32 under any policy
    if training and self.trainable:
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, self.gamma, self.beta, epsilon=self.epsilon, is_training=True)
        # The kernel returns the batch's variance with Bessel's correction; Keras averages
        # the population variance into the moving one.
        n = tf.cast(tf.size(x) // tf.shape(x)[-1], tf.float32)
        variance = variance * (n - 1.0) / n
        m = self.momentum
        self.moving_mean.assign(self.moving_mean * m + mean * (1.0 - m))
        self.moving_variance.assign(self.moving_variance * m + variance * (1.0 - m))
    else:
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, self.gamma, self.beta, mean=self.moving_mean, variance=self.moving_variance,
            epsilon=self.epsilon, is_training=False)
    return tf.cast(y, self.compute_dtype)


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
