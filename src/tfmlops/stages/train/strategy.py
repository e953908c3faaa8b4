"""The tf.distribute strategy of a training run, and the devices it needs.

`train.strategy`:
- `auto`: MultiWorkerMirroredStrategy when TF_CONFIG names a cluster of more
  than one task, MirroredStrategy when more than one GPU is visible, else the
  default (single-device) strategy.
- `default`, `mirrored`, `multi_worker`: that one. `mirrored` on a CPU-only
  machine splits the CPU into `train.replicas` logical devices, so the
  replica code path (per-replica batches, all-reduce) runs and is tested here.

Constraint: logical devices and MultiWorkerMirroredStrategy must be set up
before TensorFlow initialises its devices, i.e. before the first op of the
process. `prepare_devices` and `make_strategy` therefore run first in the
train stage; a process that already ran TensorFlow ops (a test session) gets
a clear error instead of a silently single-replica run.
"""

from __future__ import annotations

import json
import os

from tfmlops.errors import ConfigError

KINDS = ("default", "mirrored", "multi_worker")


def cluster_tasks(tf_config: str | None) -> int:
    """How many tasks (chief + workers) TF_CONFIG names; 0 without TF_CONFIG."""
    if not tf_config:
        return 0
    try:
        cluster = json.loads(tf_config).get("cluster", {})
    except (json.JSONDecodeError, AttributeError):
        raise ConfigError("TF_CONFIG is not valid JSON; fix or unset it") from None
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def resolve_strategy(setting: str, tf_config: str | None, gpus: int) -> str:
    """`train.strategy` -> default | mirrored | multi_worker."""
    if setting in KINDS:
        return setting
    if setting != "auto":
        raise ValueError(f"unknown strategy {setting!r}")
    if cluster_tasks(tf_config) > 1:
        return "multi_worker"
    return "mirrored" if gpus > 1 else "default"


def visible_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def prepare_devices(kind: str, replicas: int) -> None:
    """Split the CPU into `replicas` logical devices for `mirrored` without GPUs (before
    TensorFlow's first op: see the module docstring)."""
    import tensorflow as tf

    if kind != "mirrored" or replicas < 2 or tf.config.list_physical_devices("GPU"):
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError:  # devices already initialised in this process
        have = len(tf.config.list_logical_devices("CPU"))
        if have < replicas:
            raise ConfigError(
                f"train.strategy: mirrored with train.replicas {replicas} needs {replicas} "
                f"logical CPUs set up before TensorFlow starts, this process already has {have}; "
                "run `tfmlops train` in a fresh process") from None


def make_strategy(kind: str, replicas: int):
    """The tf.distribute strategy for a resolved `kind` (see `resolve_strategy`)."""
    import tensorflow as tf

    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if tf.config.list_logical_devices("GPU"):
        return tf.distribute.MirroredStrategy()  # every visible GPU (CUDA_VISIBLE_DEVICES)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def strategy_placement(strategy, kind: str) -> dict:
    """What to log about the strategy a run really used."""
    return {"strategy": kind, "strategy_class": type(strategy).__name__,
            "replicas": int(strategy.num_replicas_in_sync),
            "workers": max(cluster_tasks(os.environ.get("TF_CONFIG")), 1)}
