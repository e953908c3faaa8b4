"""Label issues after `train`, on real digits with 2% of the images moved to another class
folder (benchmarks/label_flips.py plants them and scores the list): the list holds the
planted flips that landed in val or test (a recall floor) and little else (a precision
floor: the 50 lowest p(given), the list before confident learning, scored 0.3 here)."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest
from test_train import NO_TUNE, QUIET, artifact_paths

from conftest import ROOT, mlflow_client, stage_runs
from tfmlops.artifacts import LABEL_ISSUES_CSV, LABEL_ISSUES_PNG, MANIFEST

SHARE, SEED = 0.02, 1  # 36 of the 1,797 digits moved
# Twice the tiny model's widths. The floors sit below what planting seeds 1-6 scored here
# (BENCHMARKS.md, "Label issues on planted flips"), above the old list's precision.
MODEL = {"blocks": [{"filters": 16, "kernel_size": 3, "separable": False},
                    {"filters": 32, "kernel_size": 3, "separable": False}], "head_units": 64}
RECALL_FLOOR, PRECISION_FLOOR = 0.5, 0.6


def flips():
    """benchmarks/label_flips.py, whose planting and scoring this test shares."""
    bench = str(ROOT / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import label_flips

    return label_flips


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_planted_flips_are_listed_and_clean_images_are_not(prepared_digits, make_cfg, tmp_path):
    from tfmlops.stages import prepare, train

    images = tmp_path / "images"
    shutil.copytree(prepared_digits.paths.builtin, images)
    planted = flips().plant_flips(images, SHARE, SEED)
    data = {"image_dir": str(images)}
    prepare.run(make_cfg(data=data, **QUIET))
    cfg = make_cfg(data=data, model=MODEL, train={**NO_TUNE, "epochs": 10, "batch_size": 16,
                                                  "schedule": {"name": "constant"},
                                                  "optimizer": {"learning_rate": 0.005}})
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    held = flips().planted_held_out(planted, manifest)

    metrics = train.run(cfg)

    assert metrics["test_accuracy"] > 0.8  # a model that learned the digits
    reports = Path(cfg.paths.reports)
    with open(reports / LABEL_ISSUES_CSV, newline="") as fh:
        suspects = list(csv.DictReader(fh))
    scored = flips().score(held, [(s["sha256"], s["given"]) for s in suspects])
    print(f"test accuracy {metrics['test_accuracy']:.3f}; {len(planted)} planted, {len(held)} in "
          f"val/test, {metrics['label_issues_flagged']} flagged: {scored}")
    assert len(held) >= 5, "too few planted flips in val/test to score the list"
    assert scored["recall"] >= RECALL_FLOOR and scored["precision"] >= PRECISION_FLOOR, scored

    # every flagged image listed (fewer than train.label_issues), lowest p(given) first,
    # none of them predicted as its given label
    assert metrics["label_issues_flagged"] == len(suspects) < cfg.train.label_issues
    assert json.loads((reports / "train.json").read_text())["label_issues_flagged"] == len(suspects)
    assert [int(s["rank"]) for s in suspects] == list(range(1, len(suspects) + 1))
    p_given = [float(s["p_given"]) for s in suspects]
    assert p_given == sorted(p_given)
    assert all(s["split"] in ("val", "test") and s["predicted"] != s["given"] for s in suspects)
    assert all(float(s["margin"]) < 0 for s in suspects)
    # a listed flip names its file, true class and hash as prepare's manifest has them
    flipped = {p["file"]: p for p in planted}
    hits = [s for s in suspects if s["file"] in flipped]
    assert hits and all((s["given"], s["sha256"]) == (flipped[s["file"]]["given"],
                                                     flipped[s["file"]]["sha256"]) for s in hits)
    print(f"{sum(s['predicted'] == flipped[s['file']]['true'] for s in hits)} of {len(hits)} "
          "listed flips predicted as their true class")
    assert sum(s["predicted"] == flipped[s["file"]]["true"] for s in hits) >= 0.8 * len(hits)

    assert (reports / LABEL_ISSUES_PNG).stat().st_size > 0
    (run,) = stage_runs(cfg, "train")
    artifacts = artifact_paths(mlflow_client(cfg), run.info.run_id, "reports")
    assert {f"reports/{LABEL_ISSUES_CSV}", f"reports/{LABEL_ISSUES_PNG}"} <= set(artifacts)
