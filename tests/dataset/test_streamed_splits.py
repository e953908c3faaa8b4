"""Evaluation and sampling read a split batch by batch from its TFRecords
(`pipeline.rows_at`, `pipeline.predicted`): the same images and answers as the
whole split in memory, and a peak that does not grow with the split (1x vs 4x)."""

from __future__ import annotations

import json
import shutil
import tracemalloc

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def splits(prepared_digits, tmp_path_factory):
    """(cfg, the digits prepared, the same split four times over in another folder)."""
    from tfmlops.data import pipeline

    cfg = prepared_digits
    source = pipeline.load_prepared(cfg)
    folder = tmp_path_factory.mktemp("four_times") / "prepared"
    shutil.copytree(source.folder, folder)
    for path in sorted(folder.glob("*.tfrecord")):
        for copy in (1, 2, 3):
            shutil.copy2(path, path.with_name(f"{path.stem}-copy{copy}.tfrecord"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["split_counts"] = {k: 4 * v for k, v in manifest["split_counts"].items()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    four = pipeline.Prepared(folder, source.classes, manifest["split_counts"],
                             source.image_size, source.channels, source.mean, source.std,
                             source.stored_size)
    return cfg, source, four


def test_rows_at_gives_the_images_indexing_the_whole_split_gives(splits):
    from tfmlops.compress.tflite import sample_indices
    from tfmlops.data import pipeline

    cfg, prepared, _ = splits
    whole, _ = pipeline.arrays(cfg, prepared, "train")
    for indices in ([0, 1], sample_indices(len(whole), 40, cfg.seed), [len(whole) - 1],
                    range(len(whole))):
        np.testing.assert_array_equal(
            pipeline.rows_at(cfg, prepared, "train", indices, batch_size=64),
            whole[np.asarray(indices)])


class _Model:
    """A deterministic stand-in with Keras's predict: the mean of each image."""

    def predict(self, x, batch_size=None, verbose=0):
        x = np.asarray(x)
        return np.stack([x.mean(axis=(1, 2, 3)), -x.mean(axis=(1, 2, 3))], axis=1)


def test_predicted_answers_for_every_image_in_file_order(splits):
    from tfmlops.data import pipeline

    cfg, prepared, _ = splits
    x, y = pipeline.arrays(cfg, prepared, "test")
    labels, outputs = pipeline.predicted(_Model(), cfg, prepared, "test", 32)
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(outputs, _Model().predict(x), rtol=1e-6)


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_split(splits):
    """Sampling 32 train images and predicting the test split, at 1x and 4x: the peak of
    what Python holds (tracemalloc) stays far below the 4x split's images, and the
    sample's does not grow at all, where reading the whole split grows 4x."""
    from tfmlops.compress.tflite import sample_indices
    from tfmlops.data import pipeline

    cfg, one, four = splits
    image_bytes = int(np.prod(one.input_shape)) * 4
    peaks = {}
    for name, prepared in (("1x", one), ("4x", four)):
        n = prepared.counts["train"]
        sample = sample_indices(n, 32, cfg.seed)
        peaks[name] = {
            "sample": _peak(lambda p=prepared, s=sample: pipeline.rows_at(cfg, p, "train", s)),
            "predict": _peak(lambda p=prepared: pipeline.predicted(_Model(), cfg, p, "test", 64)),
            "whole": _peak(lambda p=prepared: pipeline.arrays(cfg, p, "train")),
        }
    print(peaks)
    assert peaks["4x"]["whole"] > 3 * peaks["1x"]["whole"]  # what the old path held
    assert peaks["4x"]["sample"] < 1.5 * peaks["1x"]["sample"]
    assert peaks["4x"]["predict"] < four.counts["test"] * image_bytes / 4
