"""Which Keras dtype policy a run uses, and proof that loss scaling is on.

`train.precision: auto` resolves to `mixed_float16` on CUDA GPUs of compute
capability 7.0 or newer (tensor cores) and to `float32` everywhere else: the
CPUs here have no bf16/fp16 units, so mixed precision would only be slower.
`mixed_float16` needs loss scaling; Keras 3 `compile` wraps the optimizer in a
`LossScaleOptimizer` when the model's policy is mixed_float16, and
`uses_loss_scaling` checks that it did. The model's last layer computes in
float32 whatever the policy (see model/builder.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
MIN_FLOAT16_CAPABILITY = (7, 0)  # Volta: the first tensor cores


def resolve_precision(setting: str, gpu_capabilities: Sequence[tuple[int, int]]) -> str:
    """The policy name for `train.precision`, given the visible GPUs' compute capabilities."""
    if setting in POLICIES:
        return setting
    if setting != "auto":
        raise ValueError(f"unknown precision {setting!r}")
    if gpu_capabilities and all(tuple(c) >= MIN_FLOAT16_CAPABILITY for c in gpu_capabilities):
        return "mixed_float16"
    return "float32"


def gpu_capabilities() -> list[tuple[int, int]]:
    """Compute capability of every visible CUDA GPU (empty on CPU-only machines)."""
    import tensorflow as tf

    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        found.append(tuple(capability) if capability else (0, 0))
    return found


@contextlib.contextmanager
def global_policy(policy: str, keras) -> Iterator[None]:
    """Set Keras' global dtype policy for the block, then restore the previous one.

    The policy is read when layers are created: build the model inside the block.
    """
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def uses_loss_scaling(model, keras) -> bool:
    """True when the compiled model's optimizer scales the loss (needed for float16)."""
    return isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)


def inner_optimizer(optimizer):
    """The optimizer that holds the learning rate (unwraps a LossScaleOptimizer)."""
    return getattr(optimizer, "inner_optimizer", optimizer)
