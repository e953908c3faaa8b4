"""Confident learning as train lists label issues (stages/train/label_issues.py): pure
numpy, no model; checked against cleanlab 2.9 (the test extra; the package never imports
it), on out-of-sample probabilities of a real classifier on real digits and on searched
ones."""

from __future__ import annotations

import io
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tfmlops.artifacts import LABEL_ISSUES_CSV, LABEL_ISSUES_PNG, MANIFEST
from tfmlops.stages.train import label_issues as li


def cleanlab_flags(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """cleanlab's mask for the variant train implements."""
    from cleanlab.filter import find_label_issues

    return find_label_issues(labels, probs, filter_by="confident_learning")


def noisy_probabilities(seed: int, n: int, classes: int, noise: float, sharpness: float,
                        dtype, missing: bool):
    """(probabilities, given labels) as a classifier gives them on held-out images: logits
    around each image's true class, a share `noise` of the labels moved to another class;
    `missing`: one class never given (its threshold is out of reach)."""
    rng = np.random.default_rng(seed)
    true = rng.integers(0, classes, n)
    logits = rng.normal(0, 1, (n, classes))
    logits[np.arange(n), true] += sharpness * rng.uniform(0.2, 1.5, n)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = (probs / probs.sum(axis=1, keepdims=True)).astype(dtype)
    labels = true.copy()
    moved = rng.random(n) < noise
    labels[moved] = (true[moved] + rng.integers(1, classes, moved.sum())) % classes
    if missing:
        labels[labels == classes - 1] = 0
    return probs, labels


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(10, 400), classes=st.integers(2, 12),
       noise=st.sampled_from([0.0, 0.02, 0.1, 0.3]), sharpness=st.floats(0.0, 8.0),
       dtype=st.sampled_from([np.float32, np.float64]), missing=st.booleans())
def test_the_rule_flags_what_cleanlab_flags(seed, n, classes, noise, sharpness, dtype, missing):
    """The same mask as cleanlab's filter_by="confident_learning", searched over sizes,
    class counts, noise, confidence, float32 and float64, and a class never given; the
    ranking (lowest p(given) first) lists the same rows in the same order of p(given)."""
    probs, labels = noisy_probabilities(seed, n, classes, noise, sharpness, dtype, missing)
    if len(np.unique(labels)) < 2:  # cleanlab refuses a single class
        return
    mask = li.flagged(probs, labels)
    np.testing.assert_array_equal(mask, cleanlab_flags(probs, labels))

    from cleanlab.filter import find_label_issues

    theirs = find_label_issues(labels, probs, filter_by="confident_learning",
                               return_indices_ranked_by="self_confidence")
    ours, count = li.ranked(probs, labels, n)
    assert count == mask.sum() and sorted(ours) == sorted(theirs)
    p_given = li.self_confidence(probs, labels)
    np.testing.assert_array_equal(p_given[ours], p_given[theirs])  # cleanlab's sort is unstable


# probabilities on a coarse grid: ties with thresholds and between classes are common, as
# with saturated softmax outputs
grid_rows = st.lists(st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0]),
                              min_size=3, max_size=3), min_size=2, max_size=60)


@settings(max_examples=150, deadline=None)
@given(rows=grid_rows, labels=st.lists(st.integers(0, 2), min_size=60, max_size=60),
       n=st.integers(0, 70))
def test_ties_flag_what_cleanlab_flags_and_never_a_row_predicted_as_given(rows, labels, n):
    probs = np.asarray(rows, np.float64)
    probs = probs / np.maximum(probs.sum(axis=1, keepdims=True), 1e-9)
    labels = np.asarray(labels[:len(rows)])
    mask = li.flagged(probs, labels)
    if len(np.unique(labels)) > 1:
        np.testing.assert_array_equal(mask, cleanlab_flags(probs, labels))
    # what the old list got wrong: a row whose most probable class is its label
    assert not (mask & (probs.argmax(axis=1) == labels)).any()
    listed, count = li.ranked(probs, labels, n)
    assert count == mask.sum() and len(listed) == min(n, count)
    assert mask[listed].all() and len(set(listed.tolist())) == len(listed)
    keys = [(li.self_confidence(probs, labels)[i], i) for i in listed]
    assert keys == sorted(keys)  # lowest p(given) first; ties: the earlier row first


def test_on_a_real_classifiers_out_of_sample_probabilities():
    """k nearest neighbours on sklearn's digits, 3% of the labels moved to another class,
    probabilities out of sample (5-fold cross-validation; tenths, so ties abound): the
    same flags as cleanlab's, most of them moved labels, none predicted as given."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import cross_val_predict
    from sklearn.neighbors import KNeighborsClassifier

    x, true = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    labels = true.copy()
    moved = rng.choice(len(true), int(0.03 * len(true)), replace=False)
    labels[moved] = (true[moved] + rng.integers(1, 10, len(moved))) % 10
    probs = cross_val_predict(KNeighborsClassifier(10), x, labels, cv=5, method="predict_proba")
    mask = li.flagged(probs, labels)
    np.testing.assert_array_equal(mask, cleanlab_flags(probs, labels))
    found, planted = set(np.flatnonzero(mask).tolist()), set(moved.tolist())
    # measured: 43 of the 54 flags are among the 53 moved labels
    assert len(found & planted) >= 0.6 * len(planted) and len(found & planted) >= 0.6 * len(found)
    assert not (mask & (probs.argmax(axis=1) == labels)).any()


def test_thresholds_are_per_class_means_of_their_own_probability():
    probs = np.array([[0.9, 0.1], [0.7, 0.3], [0.4, 0.6], [0.2, 0.8]])
    np.testing.assert_allclose(li.thresholds(probs, np.array([0, 0, 1, 1])), [0.8, 0.7])
    np.testing.assert_allclose(li.thresholds(probs, np.array([0, 0, 0, 0])), [0.55, li.NEVER])
    # row 3 (given 0): 0.8 reaches class 1's 0.7, not class 0's 0.8 -> flagged
    assert li.flagged(probs, np.array([0, 0, 1, 0])).tolist() == [False, False, False, True]
    assert li.flagged(np.zeros((0, 2)), np.zeros(0, int)).shape == (0,)


def test_a_probability_a_rounding_below_its_threshold_reaches_it():
    """Three 0.1s average to 0.10000000000000002: the last row's 0.1 still reaches class
    0's threshold (cleanlab's tolerance of 1e-6), the only class it reaches, so that row,
    given 1 and predicted 2, is flagged."""
    probs = np.array([[0.1, 0.0, 0.9]] * 3 + [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0],
                                             [0.1, 0.05, 0.85]])
    labels = np.array([0, 0, 0, 1, 2, 1])
    assert li.thresholds(probs, labels)[0] > 0.1
    expected = [False] * 5 + [True]
    assert li.flagged(probs, labels).tolist() == expected
    assert cleanlab_flags(probs, labels).tolist() == expected


def test_held_out_locates_rows_in_their_split():
    held = li.HeldOut.of({"test": (np.array([0, 1]), np.eye(2)[[0, 1]]),
                          "val": (np.array([1, 1, 0]), np.eye(2)[[1, 0, 0]])})
    assert [held.locate(r) for r in range(5)] == [("test", 0), ("test", 1), ("val", 0),
                                                  ("val", 1), ("val", 2)]
    labels, probs = held.split("val")
    assert labels.tolist() == [1, 1, 0] and probs.shape == (3, 2)
    # val's row 1 (given 1, the model sure of 0) is the only flag
    assert li.ranked(held.probs, held.labels, 5)[0].tolist() == [3]


def png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (8, 8), value).save(buf, "PNG")
    return buf.getvalue()


def test_write_names_files_from_the_manifest_and_draws_the_sheet(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"files": [
        {"file": "cat/a.png", "sha256": "a", "label": "cat", "split": "val"},
        {"file": "dog/b.png", "sha256": "b", "label": "dog", "split": "test"},
        {"file": "dog/b2.png", "sha256": "b", "label": "dog", "split": "test"},
        {"file": "cat/c.png", "sha256": "c", "label": "cat", "split": "train"}]}))
    found = li.Found(looked_at=9, flagged=3, listed=[
        li.Suspect("test", "b", png(200), 1, 0, 0.1, 0.9, -0.8),
        li.Suspect("val", "a", png(10), 0, 1, 0.2, 0.8, -0.6)])
    csv, sheet = li.write(found, ["cat", "dog"], tmp_path, tmp_path / "reports")
    lines = csv.read_text().splitlines()
    assert lines[0] == ",".join(li.COLUMNS)
    assert lines[1].startswith("1,test,dog/b.png; dog/b2.png,b,dog,cat,0.1,0.9,-0.8")
    assert lines[2].startswith("2,val,cat/a.png,a,cat,dog,0.2,0.8,-0.6")
    assert Image.open(tmp_path / "reports" / LABEL_ISSUES_PNG).format == "PNG"
    # both returned, for the harness to log under reports/ (train's Stage.keep)
    assert (csv.name, sheet.name) == (LABEL_ISSUES_CSV, LABEL_ISSUES_PNG)

    for nothing in (li.Found(9, 0, []), None):  # none flagged; train.label_issues: 0
        (tmp_path / "reports" / LABEL_ISSUES_PNG).unlink()
        empty, _ = li.write(nothing, ["cat", "dog"], tmp_path, tmp_path / "reports")
        assert empty.read_text().splitlines() == [",".join(li.COLUMNS)]  # header only
        assert (tmp_path / "reports" / LABEL_ISSUES_PNG).is_file()  # DVC's declared plot


def test_margins_are_p_given_minus_the_best_other_class():
    probs = np.array([[0.7, 0.2, 0.1], [0.05, 0.15, 0.8], [0.3, 0.6, 0.1]])
    np.testing.assert_allclose(li.margins(probs, np.array([0, 0, 1])), [0.5, -0.75, 0.3])
