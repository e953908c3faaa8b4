"""The sections every stage reads: tracking, profiling, paths."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from tfmlops.config.credentials import uri_problem
from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text


class TrackingConfig(Section):
    enabled: bool = True
    experiment: Text = "tfmlops"
    # Used only when MLFLOW_TRACKING_URI is unset; relative sqlite paths are
    # resolved against the repository root (never a `dvc exp --temp` copy).
    uri: Text = "sqlite:///mlflow.db"
    connect_timeout_s: Annotated[float, Meta(ge=0.1, le=600.0)] = 5.0
    retries: Annotated[int, Meta(ge=0, le=20)] = 3
    # false: `tfmlops prepare` exits once its sidecar process holds its run; the sidecar
    # delivers it to the store afterwards (later stages wait for it). true, and under
    # `dvc exp run`: it waits.
    wait: bool = False

    def _rules(self):
        # params are published (MLflow params, resolved_params.yaml): no password here
        problem = uri_problem(self.uri)
        if problem:
            raise Rule(problem)


class ProfilingConfig(Section):
    enabled: bool = True
    start_step: Annotated[int, Meta(ge=1, le=1_000_000)] = 5  # skip warm-up and tracing steps
    steps: Annotated[int, Meta(ge=1, le=1000)] = 3
    # Runs kept per stage under paths.profiles/<stage>/, for TensorBoard side by side.
    keep_runs: Annotated[int, Meta(ge=1, le=1000)] = 5


class PathsConfig(Section):
    """Every path the pipeline reads or writes; dvc.yaml reads these too (${paths.*})."""

    builtin: Text = "data/builtin"  # materialize: the built-in dataset as class folders
    prepared: Text = "data/prepared"  # prepare: TFRecords, manifest.json, stats.json
    cache: Text = "data/cache"  # train input: pipeline.cache's disk files, one folder per data
    prepare_cache: Text = "data/prepare_cache"  # prepare: per-image results by content hash
    tuner: Text = "data/tuner"  # tune: keras-tuner state, kept between runs
    tuned: Text = "models/tuned"  # tune: best_hparams.yaml
    train: Text = "models/train"  # train: model.keras
    backup: Text = "models/train_backup"  # train: BackupAndRestore state, kept on a kill
    pruned: Text = "models/pruned"  # prune: the pruned tf_keras model
    tflite: Text = "models/tflite"  # quantize: every .tflite variant
    export: Text = "models/export"  # export: SavedModel, ONNX, edge TFLite
    reports: Text = "reports"  # metrics and plots of every stage
    profiles: Text = "reports/profiles"  # TensorFlow Profiler traces, per stage
