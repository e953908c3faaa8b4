"""TensorFlow Profiler traces of a few steady-state steps of each stage.

Traces land in `paths.profiles/<stage>/` in the layout `tensorboard --logdir`
and its profile plugin read; the stage's run logs the folder as artifacts.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from tfmlops.config import Config


def profile_dir(cfg: Config, stage: str) -> Path:
    return Path(cfg.paths.profiles) / stage


def fresh_profile_dir(cfg: Config, stage: str) -> Path:
    """An empty trace folder for this run (old traces would be logged again)."""
    folder = profile_dir(cfg, stage)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def keras_profile_batch(cfg: Config, steps_per_epoch: int) -> int | tuple[int, int]:
    """The TensorBoard callback's `profile_batch`: a few steps after warm-up, or 0 (off)."""
    if not cfg.profiling.enabled or steps_per_epoch < 2:
        return 0
    start = min(cfg.profiling.start_step, steps_per_epoch - 1)
    stop = min(start + cfg.profiling.steps - 1, steps_per_epoch)
    return (max(start, 1), max(stop, start, 1))


@contextlib.contextmanager
def trace(cfg: Config, stage: str) -> Iterator[Path | None]:
    """Profile the work inside the block (call only around steady-state steps)."""
    if not cfg.profiling.enabled:
        yield None
        return
    import tensorflow as tf

    folder = fresh_profile_dir(cfg, stage)
    tf.profiler.experimental.start(str(folder))
    try:
        yield folder
    finally:
        tf.profiler.experimental.stop()


def trace_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).rglob("*.xplane.pb"))
