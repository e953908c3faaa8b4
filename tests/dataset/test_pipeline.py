"""The input pipeline: shapes, dtypes, normalization, determinism, augmentation."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tfmlops.data import pipeline
from tfmlops.errors import DataError


@pytest.fixture(scope="module")
def prepared(prepared_digits):
    return pipeline.load_prepared(prepared_digits)


def test_manifest_obeys_its_schema(prepared_digits):
    folder = Path(prepared_digits.paths.prepared)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["classes"] == [str(i) for i in range(10)]
    assert sum(manifest["split_counts"].values()) == 1797 == len(manifest["files"])
    for split, per_class in manifest["class_counts"].items():
        assert sum(per_class.values()) == manifest["split_counts"][split]
    assert manifest["source_sizes"]["width"] == {"min": 8, "max": 8, "mean": 8.0}
    assert len({f["sha256"] for f in manifest["files"]}) > 1700
    assert json.loads((folder / "quarantine.json").read_text()) == []


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
    for split in ("train", "val", "test"):
        _, y = pipeline.arrays(prepared_digits, prepared, split)
        assert len(y) == prepared.counts[split]


def test_training_order_is_deterministic_with_the_seed(prepared_digits, prepared):
    def first_labels(cfg):
        ds = pipeline.dataset(cfg, prepared, "train", batch_size=64, training=True)
        return np.concatenate([y.numpy() for _, y in ds.take(3)])

    a, b = first_labels(prepared_digits), first_labels(prepared_digits)
    np.testing.assert_array_equal(a, b)
    other = dataclasses.replace(prepared_digits, seed=prepared_digits.seed + 1)
    assert not np.array_equal(a, first_labels(other))


def test_augmentation_changes_training_images_only(prepared_digits, prepared):
    aug = dataclasses.replace(
        prepared_digits,
        pipeline=dataclasses.replace(
            prepared_digits.pipeline,
            augment=dataclasses.replace(prepared_digits.pipeline.augment, enabled=True),
            shuffle_buffer=1,
        ),
    )
    plain = dataclasses.replace(
        aug, pipeline=dataclasses.replace(aug.pipeline, augment=prepared_digits.pipeline.augment))
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
    stale = dataclasses.replace(prepared_digits,
                                data=dataclasses.replace(prepared_digits.data, image_size=32))
    with pytest.raises(DataError, match="stale"):
        pipeline.load_prepared(stale)


def test_autotune_param_reaches_tf_data_and_changes_no_batch(prepared_digits, prepared):
    def batches(autotune):
        cfg = dataclasses.replace(prepared_digits, pipeline=dataclasses.replace(
            prepared_digits.pipeline, autotune=autotune))
        ds = pipeline.dataset(cfg, prepared, "train", batch_size=64, training=True)
        assert ds.options().autotune.enabled is autotune
        return [(x.numpy(), y.numpy()) for x, y in ds.take(3)]

    for (x, y), (ax, ay) in zip(batches(False), batches(True), strict=True):
        np.testing.assert_array_equal(y, ay)
        np.testing.assert_array_equal(x, ax)
