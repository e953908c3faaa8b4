"""The input pipeline: shapes, dtypes, normalization, determinism, augmentation."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tfmlops.artifacts import MANIFEST, QUARANTINE
from tfmlops.config import replace
from tfmlops.data import pipeline
from tfmlops.errors import DataError


@pytest.fixture(scope="module")
def prepared(prepared_digits):
    return pipeline.load_prepared(prepared_digits)


def test_manifest_obeys_its_schema(prepared_digits):
    folder = Path(prepared_digits.paths.prepared)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["classes"] == [str(i) for i in range(10)]
    assert sum(manifest["split_counts"].values()) == 1797 == len(manifest["files"])
    for split, per_class in manifest["class_counts"].items():
        assert sum(per_class.values()) == manifest["split_counts"][split]
    assert manifest["source_sizes"]["width"] == {"min": 8, "max": 8, "mean": 8.0}
    assert len({f["sha256"] for f in manifest["files"]}) > 1700
    assert json.loads((folder / QUARANTINE).read_text()) == []


def test_batches_have_model_shapes_and_dtypes(prepared_digits, prepared):
    ds = pipeline.dataset(prepared_digits, prepared, "train", batch_size=32, training=True)
    x, y = next(iter(ds))
    assert x.shape == (32, 16, 16, 1) and x.dtype.name == "float32"
    assert y.shape == (32,) and y.dtype.name == "int64"
    assert set(np.unique(y.numpy())) <= set(range(10))


def test_train_split_is_normalized_with_its_own_statistics(prepared_digits, prepared):
    x, _ = pipeline.arrays(prepared_digits, prepared, "train")
    assert abs(float(x.mean())) < 1e-3
    assert abs(float(x.std()) - 1.0) < 1e-2
    raw, _ = pipeline.arrays(prepared_digits, prepared, "train", normalize=False)
    assert raw.min() >= 0 and raw.max() <= 1.0
    np.testing.assert_allclose(raw.mean(), prepared.mean[0], rtol=1e-4)


def test_each_split_has_every_example_once(prepared_digits, prepared):
    """Each split's examples are the manifest's files of that split, each once: the label
    counts are the manifest's, and there are as many different images as different
    sha256s (digits holds a few byte-identical images: they count once on both sides)."""
    from collections import Counter

    manifest = json.loads((Path(prepared_digits.paths.prepared) / MANIFEST).read_text())
    for split in ("train", "val", "test"):
        x, y = pipeline.arrays(prepared_digits, prepared, split)
        files = [f for f in manifest["files"] if f["split"] == split]
        assert len(y) == len(files) == prepared.counts[split]
        assert Counter(manifest["classes"][i] for i in y) == Counter(f["label"] for f in files)
        distinct = np.unique(x.reshape(len(x), -1), axis=0)
        assert len(distinct) == len({f["sha256"] for f in files}), split


def test_training_order_is_deterministic_with_the_seed(prepared_digits, prepared):
    def first_labels(cfg):
        ds = pipeline.dataset(cfg, prepared, "train", batch_size=64, training=True)
        return np.concatenate([y.numpy() for _, y in ds.take(3)])

    a, b = first_labels(prepared_digits), first_labels(prepared_digits)
    np.testing.assert_array_equal(a, b)
    other = replace(prepared_digits, seed=prepared_digits.seed + 1)
    assert not np.array_equal(a, first_labels(other))


def test_augmentation_changes_training_images_only(prepared_digits, prepared):
    aug = replace(
        prepared_digits,
        pipeline=replace(
            prepared_digits.pipeline,
            augment=replace(prepared_digits.pipeline.augment, enabled=True),
            shuffle_buffer=1,
        ),
    )
    plain = replace(
        aug, pipeline=replace(aug.pipeline, augment=prepared_digits.pipeline.augment))
    xa, _ = next(iter(pipeline.dataset(aug, prepared, "train", batch_size=16, training=True)))
    xp, _ = next(iter(pipeline.dataset(plain, prepared, "train", batch_size=16, training=True)))
    assert xa.shape == xp.shape and np.isfinite(xa.numpy()).all()
    assert not np.allclose(xa.numpy(), xp.numpy())
    ea, _ = next(iter(pipeline.dataset(aug, prepared, "test", batch_size=16)))
    ep, _ = next(iter(pipeline.dataset(plain, prepared, "test", batch_size=16)))
    np.testing.assert_array_equal(ea.numpy(), ep.numpy())


def test_missing_and_stale_prepared_data_fail_clearly(make_cfg, prepared_digits):
    with pytest.raises(DataError, match="run `dvc repro prepare`"):
        pipeline.load_prepared(make_cfg())
    stale = replace(prepared_digits,
                                data=replace(prepared_digits.data, image_size=32))
    with pytest.raises(DataError, match="stale"):
        pipeline.load_prepared(stale)


def test_autotune_param_reaches_tf_data_and_changes_no_batch(prepared_digits, prepared):
    def batches(autotune):
        cfg = replace(prepared_digits, pipeline=replace(
            prepared_digits.pipeline, autotune=autotune))
        ds = pipeline.dataset(cfg, prepared, "train", batch_size=64, training=True)
        assert ds.options().autotune.enabled is autotune
        return [(x.numpy(), y.numpy()) for x, y in ds.take(3)]

    for (x, y), (ax, ay) in zip(batches(False), batches(True), strict=True):
        np.testing.assert_array_equal(y, ay)
        np.testing.assert_array_equal(x, ax)


def _with_cache(cfg, tmp_path, mode, budget_mb=None):
    """cfg with pipeline.cache = mode and its disk files under tmp_path (the session's
    prepared folder stays read-only)."""
    pipe = replace(cfg.pipeline, cache=mode,
                               cache_budget_mb=cfg.pipeline.cache_budget_mb
                               if budget_mb is None else budget_mb)
    paths = replace(cfg.paths, cache=str(tmp_path / "cache"))
    return replace(cfg, pipeline=pipe, paths=paths)


def _two_epochs(cfg, prepared, training=True):
    ds = pipeline.dataset(cfg, prepared, "train", batch_size=64, training=training)
    return [(x.numpy(), y.numpy()) for _ in range(2) for x, y in ds]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def test_cache_auto_picks_memory_within_budget_and_disk_over_it(prepared_digits, prepared,
                                                                tmp_path):
    roomy = _with_cache(prepared_digits, tmp_path, "auto")
    assert pipeline.cache_choice(roomy, prepared)["mode"] == "memory"
    tiny = _with_cache(prepared_digits, tmp_path, "auto", budget_mb=0)
    choice = pipeline.cache_choice(tiny, prepared)
    # 16x16x1 float32 per train image
    assert choice["estimate_mb"] == round(prepared.counts["train"] * 1024 / 2**20, 1)
    assert choice["mode"] == "disk" and Path(choice["folder"]).parent == tmp_path / "cache"

    memory = _two_epochs(_with_cache(prepared_digits, tmp_path, "memory"), prepared)
    disk = _two_epochs(tiny, prepared)
    assert sorted(p.name for p in Path(choice["folder"]).iterdir()) == [
        ".lock", ".tfmlops-owned", "train-normalized.data-00000-of-00001", "train-normalized.index"]
    _assert_same_batches(memory, disk)
    _assert_same_batches(memory, _two_epochs(tiny, prepared))  # read back from the file
    _assert_same_batches(memory, _two_epochs(_with_cache(prepared_digits, tmp_path, "off"),
                                             prepared))


def test_disk_cache_key_follows_the_data_and_params(prepared_digits, prepared, tmp_path):
    cfg = _with_cache(prepared_digits, tmp_path, "disk")
    folder = pipeline.cache_folder(cfg, prepared)
    assert pipeline.cache_folder(cfg, prepared) == folder
    other_stats = dataclasses.replace(prepared, mean=[0.5])
    assert pipeline.cache_folder(cfg, other_stats) != folder


KILLED_RUN = """
import os, signal, sys
from tfmlops.config import load_config
from tfmlops.data import pipeline
cfg = load_config(sys.argv[1], overrides={"pipeline.cache": "disk", "paths.cache": sys.argv[2]})
prepared = pipeline.load_prepared(cfg)
for i, _ in enumerate(pipeline.dataset(cfg, prepared, "train", batch_size=16)):
    if i == 3:  # mid-epoch: tf.data's lockfile and unfinished data are on disk
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_killed_runs_partial_disk_cache_does_not_break_the_next_run(prepared_digits, prepared,
                                                                      tmp_path):
    import subprocess
    import sys

    cfg = _with_cache(prepared_digits, tmp_path, "disk")
    params = Path(prepared_digits.paths.prepared).parent.parent / "params.yaml"
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(params), cfg.paths.cache],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    folder = pipeline.cache_folder(cfg, prepared)
    left = sorted(p.name for p in folder.iterdir())
    assert any(name.endswith(".lockfile") for name in left), left
    assert not any(name.endswith(".index") for name in left), left

    memory = _two_epochs(_with_cache(prepared_digits, tmp_path, "memory"), prepared, False)
    _assert_same_batches(memory, _two_epochs(cfg, prepared, training=False))
    assert not any(p.name.endswith(".lockfile") for p in folder.iterdir())


def test_cache_param_still_accepts_the_old_booleans():
    from tfmlops.config import config_from_dict
    from tfmlops.errors import ConfigError

    assert config_from_dict({"pipeline": {"cache": True}}).pipeline.cache == "memory"
    assert config_from_dict({"pipeline": {"cache": False}}).pipeline.cache == "off"
    assert config_from_dict({}).pipeline.cache == "auto"
    with pytest.raises(ConfigError, match="pipeline.cache: 'ram' is not accepted"):
        config_from_dict({"pipeline": {"cache": "ram"}})
