"""TensorFlow Profiler traces of a few steady-state steps of each stage.

Traces (and Keras' TensorBoard scalars) land in `paths.profiles/<stage>/<run>/`,
one folder per run, the last `profiling.keep_runs` kept, in the layout
`tensorboard --logdir` and its profile plugin read; the stage's run logs its
own folder as artifacts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from tfmlops.config import Config
from tfmlops.files import claim_folder, owned_children

log = logging.getLogger(__name__)
PROFILE_KIND = "profile-run"  # the marker of paths.profiles/<stage>/<run> (files.claim_folder)
RUN_NAME = r"\d{8}T\d{6}(\.\d+)?(-[A-Za-z0-9_.-]+)?"  # fresh_profile_dir's names


def profile_dir(cfg: Config, stage: str) -> Path:
    """The stage's folder: one subfolder per run, so TensorBoard shows runs side by side."""
    return Path(cfg.paths.profiles) / stage


def fresh_profile_dir(cfg: Config, stage: str) -> Path:
    """A new, empty folder for this run's traces and scalars: `<stage>/<UTC time>[-<dvc exp>]`.

    Older runs' folders stay for comparison, the newest `profiling.keep_runs`
    counting this one; the rest are removed so the folder stays bounded.
    """
    parent = profile_dir(cfg, stage)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    # Two runs in one second (tests, quick stages) keep apart, the later one after the
    # earlier even when that one was pruned meanwhile (a reused name would sort first).
    n = max((_stamp_key(p.name)[1] for p in parent.iterdir() if _stamp_key(p.name)[0] == stamp),
            default=-1) + 1
    name = f"{stamp}.{n}" if n else stamp
    exp_name = os.environ.get("DVC_EXP_NAME")  # the run's name under `dvc exp run`
    if exp_name:
        name += "-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", exp_name)[:60]
    folder = parent / name
    folder.mkdir()
    claim_folder(folder, PROFILE_KIND)
    _keep_newest(parent, cfg.profiling.keep_runs)
    return folder


def _stamp_key(name: str) -> tuple[str, int]:
    stamp, _, n = name.split("-", 1)[0].partition(".")
    return stamp, int(n) if n.isdigit() else 0


def _keep_newest(parent: Path, keep: int) -> None:
    """Remove all but the newest `keep` runs; only run folders this module made (their
    marker and time-stamped name) count, anything else there is left alone."""
    runs = sorted(owned_children(parent, PROFILE_KIND, RUN_NAME),
                  key=lambda p: _stamp_key(p.name))  # oldest first
    for old in runs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
        log.debug("profiling: removed %s (profiling.keep_runs=%d)", old, keep)


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
    log.debug("%s: profiling into %s", stage, folder)
    tf.profiler.experimental.start(str(folder))
    try:
        yield folder
    finally:
        tf.profiler.experimental.stop()
        log.debug("%s: profile written: %d trace file(s)", stage, len(trace_files(folder)))


def trace_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).rglob("*.xplane.pb"))


# Keras' TensorBoard callback wraps each profiled training step in a trace event
# of this name; the step's wait for its next batch is the iterator's GetNext op.
STEP_EVENT = "Profiled batch"
INPUT_WAIT_MARK = "IteratorGetNext"


def trace_summary(folder: str | Path) -> dict[str, float]:
    """Mean step time and the share of it spent waiting for input, from a trace folder.

    xprof's overview and input-pipeline tools measure steps on accelerators
    only (on a CPU-only host they report "No step time measured"), so this
    reads the host's XSpace events directly: the steps Keras marked, and the
    time inside them covered by iterator GetNext ops. Empty without a trace.
    """
    files = trace_files(folder)
    if not files:
        return {}
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    steps: list[tuple[int, int]] = []
    waits: list[tuple[int, int]] = []
    for path in files:
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            names = {key: meta.name for key, meta in plane.event_metadata.items()}
            for line in plane.lines:
                origin_ps = line.timestamp_ns * 1000
                for event in line.events:
                    name = names.get(event.metadata_id, "")
                    span = (origin_ps + event.offset_ps,
                            origin_ps + event.offset_ps + event.duration_ps)
                    if name == STEP_EVENT:
                        steps.append(span)
                    elif INPUT_WAIT_MARK in name and name.endswith("::DoCompute"):
                        waits.append(span)
    if not steps:
        return {}
    step_ps = sum(end - start for start, end in steps)
    wait_ps = sum(_overlap(span, _union(waits)) for span in _union(steps))
    return {
        "profile_steps": len(steps),
        "profile_step_ms": step_ps / len(steps) / 1e9,
        "profile_input_wait_share": min(wait_ps / step_ps, 1.0) if step_ps else 0.0,
    }


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping spans merged (two replicas waiting at once count once)."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _overlap(window: tuple[int, int], spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(window[1], e) - max(window[0], s)) for s, e in spans)
