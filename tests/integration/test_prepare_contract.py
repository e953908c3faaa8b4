"""prepare's data contract on tiny real images: the profile, near-duplicates across
splits, drift against an accepted reference, and `tfmlops accept-reference`."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import run_cli
from tfmlops.artifacts import DATA_PROFILE, DATA_PROFILE_CLASSES, DATA_PROFILE_FEATURES, MANIFEST
from tfmlops.errors import DataError
from tfmlops.stages import prepare
from tfmlops.stages.materialize.builtin import write_digits
from tfmlops.stages.prepare.drift import NO_REFERENCE, accept_reference


def textured(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """An RGB image of random low-frequency blobs plus noise: unrelated ones differ in
    about half their pHash bits."""
    import cv2

    coarse = rng.uniform(0, 255, (5, 5, 3)).astype(np.float32)
    smooth = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    return Image.fromarray(np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8))


def textured_folder(root: Path, per_class: int = 10, classes: int = 3) -> None:
    rng = np.random.default_rng(7)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            textured(rng, 64, 48).save(root / f"c{c}" / f"p{i:02d}.jpg", quality=90)


def contract_cfg(make_cfg, tmp_path, folder, channels=3, **contract):
    return make_cfg(data={"image_dir": str(folder), "channels": channels,
                          "split": {"val": 0.25, "test": 0.25},
                          "contract": {"reference": str(tmp_path / "reference.json"), **contract}},
                    tracking={"enabled": False})


def profile_of(cfg) -> dict:
    return json.loads((Path(cfg.paths.reports) / DATA_PROFILE).read_text())


def test_a_near_duplicate_across_splits_is_reported_and_fails_or_warns(tmp_path, make_cfg, caplog):
    folder = tmp_path / "photos"
    textured_folder(folder)
    for i in range(10):  # a smaller, recompressed copy of each photo of c0
        Image.open(folder / "c0" / f"p{i:02d}.jpg").resize((56, 42)).save(
            folder / "c0" / f"copy_p{i:02d}.jpg", quality=75)
    strict = {"leakage": {"max_distance": 4, "max_share": 0.0, "severity": "error"}}
    cfg = contract_cfg(make_cfg, tmp_path, folder, **strict)
    with pytest.raises(DataError, match=r"^data contract: leakage: \d+ near-duplicate pair.*"
                                        r"c0/\S+\.jpg \(\w+\) and c0/\S+\.jpg.*max_share") as err:
        prepare.run(cfg)
    assert "\n" not in str(err.value)
    assert not Path(cfg.paths.prepared).exists()
    leakage = profile_of(cfg)["leakage"]  # written before the refusal: what it found
    assert leakage["pairs"] >= 1 and leakage["share"] > 0
    for pair in leakage["listed"]:  # each is a photo and its own copy, in two splits
        a, b = (Path(f).name.removeprefix("copy_") for f in pair["files"])
        assert a == b and pair["files"][0] != pair["files"][1], pair
        assert pair["splits"][0] != pair["splits"][1] and pair["distance"] <= 4
    assert len(leakage["listed"]) == leakage["pairs"]

    cfg = contract_cfg(make_cfg, tmp_path, folder, leakage={"severity": "warn", "max_share": 0.0})
    with caplog.at_level(logging.WARNING):
        prepare.run(cfg)
    (line,) = [r.getMessage() for r in caplog.records if "leakage" in r.getMessage()]
    assert f"{leakage['pairs']} near-duplicate pair(s)" in line
    assert profile_of(cfg)["leakage"]["listed"] == leakage["listed"]


def digits_folder(root: Path, limit: int = 300) -> Path:
    write_digits(root, limit=limit)
    return root


def test_no_reference_checks_nothing_then_accept_reference_writes_it(tmp_path, make_cfg, caplog):
    folder = digits_folder(tmp_path / "digits")
    cfg = contract_cfg(make_cfg, tmp_path, folder, channels=1)
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(NO_REFERENCE))
    shutil.rmtree(folder / "9")  # a class vanishes: nothing to compare with yet
    with caplog.at_level(logging.INFO):
        prepare.run(cfg)
    assert any("no reference profile accepted yet" in r.getMessage()
               and "tfmlops accept-reference" in r.getMessage() for r in caplog.records)
    profile = profile_of(cfg)
    assert profile["checked_against"] is None and profile["anomalies"] == []
    assert profile["images"] == sum(profile["counts"][s][c] for s in profile["counts"]
                                    for c in profile["classes"])
    assert sum(profile["features"]["brightness"]) == profile["images"]
    assert profile["features"]["format"] == {"PNG": profile["images"]}
    rows = (Path(cfg.paths.reports) / DATA_PROFILE_CLASSES).read_text().splitlines()
    assert rows[0] == "class,train,val,test" and len(rows) == 1 + 9
    features = (Path(cfg.paths.reports) / DATA_PROFILE_FEATURES).read_text()
    assert "brightness 0.25-0.3," in features and "format PNG," in features
    row = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())["files"][0]
    assert (row["format"], row["width"], row["height"]) == ("PNG", 8, 8)
    assert row["bytes"] == (folder / row["file"]).stat().st_size

    result = run_cli("--params", str(tmp_path / "params.yaml"), "accept-reference", cwd=tmp_path)
    assert json.loads(result.stdout.splitlines()[-1])["reference"] == str(reference)
    assert reference.read_bytes() == (Path(cfg.paths.reports) / DATA_PROFILE).read_bytes()


def test_drift_against_the_reference_warns_or_fails_per_severity(tmp_path, make_cfg, caplog):
    folder = digits_folder(tmp_path / "digits")
    cfg = contract_cfg(make_cfg, tmp_path, folder, channels=1)
    prepare.run(cfg)
    first = profile_of(cfg)
    accept_reference(Path(cfg.paths.reports) / DATA_PROFILE, tmp_path / "reference.json")

    metrics = prepare.run(cfg)  # nothing changed: every fact from the cache, no anomaly
    assert metrics["images_decoded"] == 0 and metrics["images_cached"] == 300
    again = profile_of(cfg)
    assert again.pop("checked_against") and first.pop("checked_against") is None
    assert again == first and again["anomalies"] == []

    for path in sorted(folder.rglob("*.png"))[::2]:  # a darkened batch: half the images
        dark = (np.asarray(Image.open(path), np.float32) * 0.3).astype(np.uint8)
        Image.fromarray(dark).save(path)
    with caplog.at_level(logging.WARNING):
        prepare.run(cfg)
    drift = [a for a in profile_of(cfg)["anomalies"] if a["kind"] == "feature_drift"]
    assert "brightness" in {a["feature"] for a in drift}
    assert all(a["severity"] == "warn" for a in drift)
    assert any("feature_drift: brightness's histogram moved" in r.getMessage()
               and "data.contract.severity.feature_drift: warn" in r.getMessage()
               for r in caplog.records)

    shutil.rmtree(folder / "9")  # a vanished class: error by default
    with pytest.raises(DataError, match=r"class_vanished: class '9'.*"
                                        r"data.contract.severity.class_vanished: error"):
        prepare.run(cfg)
    cfg = contract_cfg(make_cfg, tmp_path, folder, channels=1,
                       severity={"class_vanished": "warn", "feature_drift": "off"})
    prepare.run(cfg)
    assert [a["kind"] for a in profile_of(cfg)["anomalies"]] == ["class_vanished"]

    write_digits(tmp_path / "more", limit=100)  # a new class: error, through the CLI
    shutil.copytree(tmp_path / "more" / "1", folder / "new")
    proc = run_cli("--params", str(tmp_path / "params.yaml"), "prepare", cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert "class_appeared: class 'new'" in line
    assert "data.contract.severity.class_appeared: error" in line and "accept-reference" in line
