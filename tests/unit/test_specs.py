"""A stage's shape is declared once, in its SPEC (stages/<name>/__init__.py): dvc.yaml,
MLproject and `tfmlops --help` must agree with it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from conftest import MAX_METRIC_COLUMNS, ROOT
from tfmlops.artifacts import HEADLINES
from tfmlops.stage_spec import PIPELINE, StageSpec, spec, specs


def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def declared_files(entries) -> set[str]:
    """The file names of a dvc.yaml outs/metrics/plots list (entries are str or {path: opts})."""
    paths = [e if isinstance(e, str) else next(iter(e)) for e in entries or []]
    return {p.rsplit("/", 1)[-1] for p in paths}


def test_the_pipeline_is_dvc_yamls_stages_in_order():
    assert tuple(dvc_stages()) == PIPELINE
    assert [s.name for s in specs()] == list(PIPELINE)


@pytest.mark.parametrize("name", PIPELINE)
def test_dvc_yaml_runs_the_stage_as_its_spec_declares(name):
    stage, s = dvc_stages()[name], spec(name)
    assert stage["cmd"] == f"tfmlops {name}"
    outs = [e if isinstance(e, str) else next(iter(e)) for e in stage.get("outs", [])]
    if s.output is not None:
        assert f"${{paths.{s.output}}}" in outs
    assert [p if isinstance(p, str) else next(iter(p)) for p in stage.get("params", [])] == \
        list(s.params)
    declared = (declared_files(stage.get("outs")) | declared_files(stage.get("metrics"))
                | declared_files(stage.get("plots")))
    assert set(s.reports) <= declared, set(s.reports) - declared
    # its report is a plain output; its metrics file is its headline's, and only that
    metrics = [e if isinstance(e, str) else next(iter(e)) for e in stage.get("metrics", [])]
    assert metrics == ([f"${{paths.reports}}/{HEADLINES}/{name}.json"] if s.headline else [])
    if f"{name}.json" in s.reports:
        assert f"${{paths.reports}}/{name}.json" in outs
    code = [d for d in stage.get("deps", []) if isinstance(d, str) and d.startswith("src/")]
    assert f"src/tfmlops/stages/{name}" in code  # its own code, the folder whole


def test_the_headlines_are_few_enough_to_read_side_by_side():
    keys = [key for s in specs() for key in s.headline]
    assert len(keys) <= MAX_METRIC_COLUMNS, len(keys)
    for s in specs():
        assert len(set(s.headline)) == len(s.headline), s.name
        assert s.headline or f"{s.name}.json" not in s.reports, s.name  # a report, no headline


def test_a_headline_takes_the_declared_keys_a_report_has_flat_or_nested():
    s = StageSpec(name="x", help="", output=None,
                  headline=("serving.accuracy", "variants.int8.bytes", "absent", "a.absent"))
    report = {"serving.accuracy": 0.9, "variants": {"int8": {"bytes": 10, "p50_ms": 1.0}},
              "a": {"b": 1}, "time": "t"}
    assert s.headline_of(report) == {"serving.accuracy": 0.9, "variants.int8.bytes": 10}


@pytest.mark.parametrize("name", PIPELINE)
def test_mlproject_has_the_stages_entry_point(name):
    entry = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"][name]
    assert entry["command"] == f"tfmlops --params {{params}} {name}"


def test_tfmlops_help_lists_every_stage_with_its_specs_help():
    shown = subprocess.run([sys.executable, "-m", "tfmlops", "--help"], capture_output=True,
                           text=True, check=True, env={**os.environ, "COLUMNS": "400"}).stdout
    for s in specs():
        assert f"{s.name}  " in shown and s.help in " ".join(shown.split()), s.name


def test_the_keras_flavour_of_a_stage_is_its_specs():
    assert {s.name for s in specs() if s.keras == "tf_keras"} == {"prune", "quantize"}


def test_reading_every_spec_loads_no_stage_work():
    """`tfmlops --help` and every command read all SPECs: a stage package's top level
    holds its SPEC and `run`, and imports its work inside `run` (no numpy, no config,
    no YAML, TensorFlow least of all)."""
    probe = ("import sys; from tfmlops.stage_spec import specs; specs(); "
             "print(sorted(m for m in sys.modules if m in "
             "('numpy', 'tensorflow', 'keras', 'mlflow', 'yaml', 'tfmlops.config')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]", loaded
