"""promote's evaluation figures (pure functions of per-image arrays) and the TFRecord
reader it reads the stored split with (no TensorFlow)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.data.tfrecords import decode_example, encode_example, frame, read_records
from tfmlops.evaluation import (
    calibration,
    confusion,
    paired_interval,
    per_class,
    size_bucket,
    slices,
    summarize,
)

correctness = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(pairs=correctness, confidence=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_the_paired_interval_holds_the_observed_difference(pairs, confidence):
    cand, prod = (np.array(x, bool) for x in zip(*pairs, strict=True))
    p = paired_interval(cand, prod, confidence)
    assert p["difference"] == pytest.approx(cand.mean() - prod.mean())
    assert p["low"] - 1e-12 <= p["difference"] <= p["high"] + 1e-12
    discordant = (p["candidate_only"] + p["production_only"]) / p["images"]
    assert -discordant - 1e-12 <= p["low"] and p["high"] <= discordant + 1e-12


@settings(max_examples=100, deadline=None)
@given(correct=st.lists(st.booleans(), min_size=1, max_size=300))
def test_identical_predictions_differ_by_zero(correct):
    p = paired_interval(np.array(correct), np.array(correct), 0.95)
    assert (p["difference"], p["low"], p["high"]) == (0.0, 0.0, 0.0)


@settings(max_examples=100, deadline=None)
@given(b=st.integers(0, 40), c=st.integers(0, 40), same=st.integers(1, 200))
def test_swapping_the_versions_mirrors_the_interval(b, c, same):
    cand = np.array([True] * b + [False] * c + [True] * same)
    prod = np.array([False] * b + [True] * c + [True] * same)
    there, back = paired_interval(cand, prod, 0.95), paired_interval(prod, cand, 0.95)
    assert there["low"] == pytest.approx(-back["high"])
    assert there["high"] == pytest.approx(-back["low"])


def test_one_image_worse_is_within_the_interval_many_are_not():
    same = np.ones(269, bool)
    one = same.copy()
    one[0] = False
    assert paired_interval(one, same, 0.95)["high"] > 0
    many = same.copy()
    many[:10] = False
    assert paired_interval(many, same, 0.95)["high"] < -0.005


def test_confusion_and_per_class_count_unknown_classes_as_wrong():
    labels = np.array([0, 0, 1, 1, 2])
    predicted = np.array([0, -1, 1, 0, -1])  # -1: a class name the split does not have
    m = confusion(labels, predicted, 3)
    assert m.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 1]]
    figures = per_class(m, ["a", "b", "c"])
    assert figures["a"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert figures["c"]["recall"] == 0.0 and figures["c"]["precision"] == 0.0
    assert per_class(np.zeros((1, 2), int), ["x"])["x"]["recall"] is None


@settings(max_examples=100, deadline=None)
@given(data=st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=200))
def test_ece_is_a_weighted_gap_between_0_and_1(data):
    conf, correct = (np.array(x) for x in zip(*data, strict=True))
    cal = calibration(conf, correct)
    assert 0.0 <= cal["ece"] <= 1.0
    assert sum(b["count"] for b in cal["bins"]) == len(conf)


def test_a_perfectly_calibrated_model_has_no_calibration_error():
    conf = np.array([1.0] * 10 + [0.5] * 10)
    correct = np.array([True] * 10 + [True, False] * 5)
    assert calibration(conf, correct)["ece"] == pytest.approx(0.0)
    assert calibration(np.full(4, 0.9), np.zeros(4, bool))["ece"] == pytest.approx(0.9)


def test_summary_and_slices():
    labels, predicted = np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2])
    s = summarize(labels, predicted, np.full(4, 0.75), ["a", "b", "c"])
    assert s["accuracy"] == 0.75 and s["ece"] == pytest.approx(0.0)
    assert s["confusion"]["columns"] == ["a", "b", "c", "unknown"]
    out = slices({"format": ["png", "jpeg", "png", "unknown"]},
                 {"candidate": predicted == labels, "production": np.ones(4, bool)})
    assert out["format"]["png"] == {"images": 2, "candidate": 0.5, "production": 1.0}
    assert (size_bucket(8, 8), size_bucket(300, 200), size_bucket(None, 5)) == (
        "<64px", "256-1023px", "unknown")


@settings(max_examples=100, deadline=None)
@given(image=st.binary(max_size=300), label=st.integers(-(2**63), 2**63 - 1),
       sha=st.binary(min_size=0, max_size=64))
def test_decode_example_inverts_encode_example(image, label, sha):
    features = {"image": image, "label": label, "sha256": sha}
    assert decode_example(encode_example(features)) == features


def test_read_records_reads_what_was_framed_and_refuses_a_corrupt_file(tmp_path):
    records = [encode_example({"image": bytes([i]) * i, "label": i}) for i in range(5)]
    path = tmp_path / "test-00000-of-00001.tfrecord"
    path.write_bytes(b"".join(frame(r) for r in records))
    assert list(read_records(path)) == records
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        list(read_records(path))
