"""Training/serving skew on JPEG photos: one decoding of stored images for training,
evaluation and every served path, the skew report, and planted skews that fail export.
On the suite's one RGB photo pipeline (tests/rgb_photos.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import repo_copy
from rgb_photos import absolute_config
from tfmlops.artifacts import MANIFEST, SKEW
from tfmlops.errors import DataError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]


@pytest.fixture(scope="module")
def photo_export(rgb_photo_repo, tmp_path_factory):
    """(the pipeline's Config with absolute paths, export's report)."""
    repo = rgb_photo_repo[0]
    cfg = absolute_config(repo, tmp_path_factory.mktemp("skew_cfg"))
    return cfg, json.loads((Path(cfg.paths.reports) / "export.json").read_text())


def stored_images(cfg):
    import tensorflow as tf

    from tfmlops.data.pipeline import FEATURES, shard_files

    files = [f for split in ("train", "val", "test")
             for f in shard_files(Path(cfg.paths.prepared), split)]
    return [tf.io.parse_single_example(r, FEATURES)["image"].numpy()
            for r in tf.data.TFRecordDataset(files)]


def test_training_evaluation_and_serving_decode_stored_images_to_the_same_pixels(photo_export):
    import tensorflow as tf

    from tfmlops.data.pipeline import decode_stored
    from tfmlops.serving.preprocess import decode_image
    from tfmlops.stages.export.signatures import decode_like_prepare

    cfg, _ = photo_export
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    stored = manifest["stored"]["short_side"]
    encoded = stored_images(cfg)
    kinds = {b[:3] == b"\xff\xd8\xff" for b in encoded}
    assert kinds == {True, False}, "the prepared data hold stored JPEGs and PNGs"
    fast_differs = False
    for b in encoded:
        training = decode_stored(tf.constant(b), 3).numpy()  # tf.data and export's evaluation
        graph = decode_like_prepare(tf.constant(b), 3, stored).numpy()  # the SavedModel
        served = decode_image(b, 3, stored)  # the served pyfunc (Pillow)
        np.testing.assert_array_equal(training, graph)
        np.testing.assert_array_equal(training, served)
        fast = tf.io.decode_image(b, channels=3).numpy()  # TensorFlow's default DCT
        fast_differs |= not np.array_equal(fast, training)
    assert fast_differs, "the photos exercise the DCT difference the decoding removes"


def test_the_skew_report_covers_every_pair_and_the_strict_ones_hold(photo_export):
    cfg, metrics = photo_export
    atol = cfg.export.atol
    for pair in ("saved_model", "saved_model_bytes", "served_pyfunc", "onnx"):
        assert metrics[f"skew.{pair}.max_abs_diff"] <= atol, pair
        assert metrics[f"skew.{pair}.top1_agreement"] == 1.0, pair
    assert "skew.tflite_edge.top1_agreement" in metrics
    assert metrics["skew.source_served_pyfunc.top1_agreement"] >= \
        cfg.export.skew.source_min_agreement
    assert metrics["skew.source_saved_model_pixels.max_abs_diff"] <= \
        cfg.export.skew.source_max_grey_levels
    import mlflow

    # what export logged to its MLflow run is what its report says
    client = mlflow.MlflowClient(cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'export'")
    (run,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    logged = {k: v for k, v in run.data.metrics.items() if k.startswith("skew.")}
    assert logged == pytest.approx({k: v for k, v in metrics.items() if k.startswith("skew.")})
    report = json.loads((Path(cfg.paths.export) / SKEW).read_text())
    assert report["source_sample"]["exif_rotated"] >= 1
    assert report["source_sample"]["images"] >= 10
    assert all(p["passed"] for p in report["pairs"].values() if p["gated"])


def _swap_channels(normalize):
    return lambda image, size, mean, std: normalize(image[..., ::-1], size, mean, std)


def _no_normalization(image, size, mean, std):
    import tensorflow as tf

    return tf.image.resize(tf.cast(image, tf.float32), (size, size)) / 255.0


def _nearest_reduction(image, short_side):
    import tensorflow as tf

    h, w = tf.shape(image)[0], tf.shape(image)[1]
    scale = short_side / tf.cast(tf.minimum(h, w), tf.float64)
    size = tf.stack([tf.cast(tf.round(tf.cast(n, tf.float64) * scale), tf.int32) for n in (h, w)])
    return tf.cast(tf.image.resize(image, size, method="nearest"), tf.uint8)


PLANTED = {
    # what is planted: (module, attribute, replacement from the original, the pair named)
    "served channel order": ("tfmlops.serving.preprocess", "normalize", _swap_channels,
                             "served_pyfunc"),
    "SavedModel without normalization": ("tfmlops.stages.export.signatures", "preprocess",
                                         lambda _: _no_normalization, "saved_model_bytes"),
    "SavedModel resize filter": ("tfmlops.stages.export.signatures", "reduce_like_prepare",
                                 lambda _: _nearest_reduction, "source_saved_model_pixels"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_a_planted_skew_fails_export_with_one_line_naming_the_pair(rgb_photo_repo, planted,
                                                                    tmp_path, monkeypatch):
    import importlib

    from tfmlops.config import load_config
    from tfmlops.stages import export

    # train's resolved params name the weights file relative to the project root
    monkeypatch.chdir(repo_copy(rgb_photo_repo[0], tmp_path / "repo"))
    cfg = load_config("params.yaml")
    module, name, make, pair = PLANTED[planted]
    target = importlib.import_module(module)
    monkeypatch.setattr(target, name, make(getattr(target, name)))
    with pytest.raises(DataError) as raised:
        export.run(cfg)
    message = str(raised.value)
    assert "\n" not in message and pair in message, message
    assert "FAILED" in message
