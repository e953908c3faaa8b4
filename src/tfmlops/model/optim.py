"""Optimizers, learning-rate schedules and losses from params, for a keras module."""

from __future__ import annotations

from tfmlops.config import LossConfig, OptimizerConfig, ScheduleConfig
from tfmlops.model.custom import focal_loss_class


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
            warmup_target=learning_rate if warmup else None, warmup_steps=warmup,
        )
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
