"""What a stage is, declared once per stage (`SPEC` in stages/<name>/__init__.py), and the
pipeline's stages by name. Below stages/: the harness reads a SPEC it is given, and the
CLI reaches a stage only by its name (`package`), as dvc.yaml's `cmd` does, never by
importing it. tests/unit/test_specs.py checks dvc.yaml and MLproject agree with the SPECs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

# The pipeline's stages in dvc.yaml's order.
PIPELINE = ("materialize", "prepare", "tune", "train", "prune", "quantize", "export", "promote")


@dataclass(frozen=True)
class StageSpec:
    """What a stage is, for the CLI, the harness, dvc.yaml and MLproject."""

    name: str
    help: str  # `tfmlops --help`'s line
    # The `paths.<output>` folder it builds in staging and swaps in whole; None: no folder
    # (promote).
    output: str | None
    upstream: tuple[str, ...] = ()  # the stages whose runs this one's lineage names
    params: tuple[str, ...] = ()  # dvc.yaml's `params:` of the stage, exactly
    reports: tuple[str, ...] = ()  # reports/ files dvc.yaml lists as its outs, metrics or plots
    # The keys of its report (reports/<name>.json; "a.b" reaches into a nested one) a person
    # compares between experiments: reports/metrics/<name>.json, its DVC metrics file. Few:
    # `dvc exp show` has a column per key of every stage (tests/unit/test_specs.py: <= 60).
    headline: tuple[str, ...] = ()
    keras: str = "keras"  # "tf_keras": runs with Keras 2 in its own process (tfmot)
    tracked: bool = True  # an MLflow run (materialize: none)
    sidecar: bool = False  # the run kept by a separate process (tracking/sidecar.py)
    # Its `mlflow_run.json` goes to reports/<name>/, not into the output (prepare: its
    # output is the data alone, byte for byte; promote has no output folder).
    run_in_reports: bool = False
    detach: bool = False  # as a command with tracking.wait false, hands its run over
    # Off the chief of a distributed run (TF_CONFIG), writes a scratch folder, not its
    # output (train: every worker fits, only the chief keeps what it made).
    worker_scratch: bool = False

    def output_dir(self, cfg):
        return None if self.output is None else getattr(cfg.paths, self.output)

    def headline_of(self, report: dict) -> dict:
        """The headline keys `report` has, with their values, in the order declared."""
        found = ((key, _lookup(report, key)) for key in self.headline)
        return {key: value for key, value in found if value is not _MISSING}

    def run_dir(self, cfg) -> Path:
        """The folder of its `mlflow_run.json`: its output, or reports/<name>/."""
        if self.run_in_reports or self.output is None:
            return Path(cfg.paths.reports) / self.name
        return Path(self.output_dir(cfg))


_MISSING = object()


def _lookup(report: dict, key: str):
    """report[key], or through nested dicts ("variants.int8.bytes": a flat "a.b" key, as
    export's "serving.accuracy", or a nested one, as quantize's variants); else _MISSING."""
    if key in report:
        return report[key]
    for i, char in enumerate(key):
        if char == "." and isinstance(report.get(key[:i]), dict):
            found = _lookup(report[key[:i]], key[i + 1:])
            if found is not _MISSING:
                return found
    return _MISSING


def package(name: str):
    """The package of stage (or command) `name`, loaded by its name."""
    return importlib.import_module(f"tfmlops.stages.{name}")


def spec(name: str) -> StageSpec:
    """The SPEC of stage `name` (its package is light: TensorFlow is imported in `run`)."""
    return package(name).SPEC


def specs() -> list[StageSpec]:
    return [spec(name) for name in PIPELINE]
