"""One package per DVC stage, `stages/<name>/`: its `SPEC`, its `run(cfg) -> metrics`, and
every module only that stage uses (and `doctor`, the CLI's check of a machine, which
runs three of them in a temporary folder). Shared libraries sit below (`data/`,
`model/`, `compress/`, `serving/`, `tracking/`, `config/`); none of them imports a stage.

A stage's shape is declared once, in its SPEC: `cli` lists the stages from them, the
harness reads them, and tests/unit/test_specs.py checks dvc.yaml and MLproject agree.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

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
    reports: tuple[str, ...] = ()  # reports/ files dvc.yaml lists as its metrics or plots
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


def spec(name: str) -> StageSpec:
    """The SPEC of stage `name` (its package is light: TensorFlow is imported in `run`)."""
    return importlib.import_module(f"tfmlops.stages.{name}").SPEC


def specs() -> list[StageSpec]:
    return [spec(name) for name in PIPELINE]
