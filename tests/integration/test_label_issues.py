"""Suspected label errors after `train`, on real digits with one planted mislabel: a
clear "0" filed under "1" that lands in val or test ranks among the first suspects."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_train import NO_TUNE, QUIET, artifact_paths

from conftest import mlflow_client, stage_runs
from tfmlops.artifacts import LABEL_ISSUES_CSV, LABEL_ISSUES_PNG, MANIFEST

TRUE, WRONG = "0", "1"  # zeros are the digits the model is surest of


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plant_mislabel(images: Path, cfg) -> str:
    """Move the first "0" that prepare will put in val or test once filed under "1" (the
    split is stratified by content hash within the class it is filed under); return its
    new relative path."""
    from tfmlops.stages.prepare.images import assign_splits

    shas = {p: sha256(p) for p in sorted(images.rglob("*.png"))}
    wrong = [(h, WRONG) for p, h in shas.items() if p.parent.name == WRONG]
    counts = {}
    for h in shas.values():
        counts[h] = counts.get(h, 0) + 1
    split = cfg.data.split
    for path in sorted((images / TRUE).glob("*.png")):
        h = shas[path]
        if counts[h] == 1 and assign_splits([*wrong, (h, WRONG)], cfg.seed, split.val,
                                            split.test)[h] != "train":
            moved = images / WRONG / path.name
            path.rename(moved)
            return str(moved.relative_to(images))
    raise AssertionError(f"no {TRUE!r} lands in val or test when filed under {WRONG!r}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_planted_mislabeled_image_ranks_among_the_first_suspects(prepared_digits, make_cfg,
                                                                    tmp_path):
    from tfmlops.stages import prepare, train

    images = tmp_path / "images"
    shutil.copytree(prepared_digits.paths.builtin, images)
    data = {"image_dir": str(images)}
    planted = plant_mislabel(images, make_cfg(data=data, **QUIET))
    prepare.run(make_cfg(data=data, **QUIET))
    cfg = make_cfg(data=data, train={**NO_TUNE, "epochs": 10, "batch_size": 16, "label_issues": 12,
                                     "schedule": {"name": "constant"},
                                     "optimizer": {"learning_rate": 0.005}})
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    (row,) = [f for f in manifest["files"] if f["file"] == planted]
    assert (row["label"], row["split"] in ("val", "test")) == (WRONG, True)

    metrics = train.run(cfg)

    assert metrics["test_accuracy"] > 0.8  # a model that learned the digits
    reports = Path(cfg.paths.reports)
    with open(reports / LABEL_ISSUES_CSV, newline="") as fh:
        suspects = list(csv.DictReader(fh))
    assert len(suspects) == 12
    assert [int(s["rank"]) for s in suspects] == list(range(1, 13))
    p_given = [float(s["p_given"]) for s in suspects]
    assert p_given == sorted(p_given)  # lowest probability of the given label first
    assert {s["split"] for s in suspects} <= {"val", "test"}
    top = {s["file"]: s for s in suspects[:5]}
    assert planted in top, f"{planted} not in the top 5: {list(top)}"
    found = top[planted]
    assert (found["given"], found["predicted"], found["sha256"]) == (WRONG, TRUE, row["sha256"])
    assert float(found["p_predicted"]) > 0.5 and float(found["margin"]) < 0

    assert (reports / LABEL_ISSUES_PNG).stat().st_size > 0
    (run,) = stage_runs(cfg, "train")
    artifacts = artifact_paths(mlflow_client(cfg), run.info.run_id, "reports")
    assert {f"reports/{LABEL_ISSUES_CSV}", f"reports/{LABEL_ISSUES_PNG}"} <= set(artifacts)
