"""The suspected-label-error ranking (stages/train/label_issues.py): pure numpy, no model."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tfmlops.artifacts import LABEL_ISSUES_CSV, LABEL_ISSUES_PNG, MANIFEST
from tfmlops.stages.train import label_issues as li

# probabilities on a coarse grid: ties are common, as with saturated softmax outputs
p_values = st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]), max_size=60)


def probs_and_labels(p_given: list[float], classes: int = 3):
    """Rows whose given label (cycling through the classes) has probability p_given."""
    labels = np.arange(len(p_given)) % classes
    probs = np.zeros((len(p_given), classes))
    for i, (p, y) in enumerate(zip(p_given, labels, strict=True)):
        probs[i] = (1.0 - p) / (classes - 1)
        probs[i, y] = p
    return probs, labels


@settings(max_examples=100, deadline=None)
@given(p=p_values, n=st.integers(0, 70))
def test_rank_is_the_lowest_n_sorted_by_p_given_ties_in_row_order(p, n):
    p = np.asarray(p, np.float64)
    order = li.rank(p, n)
    assert len(order) == min(n, len(p)) and len(set(order.tolist())) == len(order)
    keys = [(p[i], i) for i in order]
    assert keys == sorted(keys)  # lowest first; ties: the earlier row first
    rest = np.setdiff1d(np.arange(len(p)), order)
    assert all((p[i], i) > keys[-1] for i in rest) if len(keys) else True


@settings(max_examples=100, deadline=None)
@given(p=p_values, n=st.integers(0, 12), cuts=st.lists(st.integers(0, 60), max_size=5))
def test_the_streamed_heap_keeps_what_ranking_all_at_once_keeps(p, n, cuts):
    """However the split is cut into batches, the bounded heap keeps the same rows in the
    same order as ranking the whole split."""
    probs, labels = probs_and_labels(p)
    hashes = [f"h{i}" for i in range(len(p))]
    worst = li.Worst(n)
    bounds = [0, *sorted(c for c in cuts if c < len(p)), len(p)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b > a:
            worst.add("val", hashes[a:b], [b""] * (b - a), probs[a:b], labels[a:b])
    kept = [s.sha256 for s in worst.suspects()]
    assert kept == [hashes[i] for i in li.rank(li.self_confidence(probs, labels), n)]


def test_a_suspect_records_given_predicted_and_margin():
    probs = np.array([[0.7, 0.2, 0.1], [0.05, 0.15, 0.8], [0.3, 0.6, 0.1]])
    labels = np.array([0, 0, 1])
    np.testing.assert_allclose(li.margins(probs, labels), [0.5, -0.75, 0.3])
    worst = li.Worst(2)
    worst.add("test", ["a", "b", "c"], [b"A", b"B", b"C"], probs, labels)
    first, second = worst.suspects()
    assert (first.sha256, first.given, first.predicted) == ("b", 0, 2)
    assert (first.p_given, first.p_predicted) == pytest.approx((0.05, 0.8))
    assert first.margin == pytest.approx(-0.75) and first.encoded == b"B"
    assert second.sha256 == "c"  # p_given 0.6; a (0.7) is not kept


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
    worst = li.Worst(5)
    worst.add("val", ["a"], [png(10)], np.array([[0.2, 0.8]]), np.array([0]))
    worst.add("test", ["b"], [png(200)], np.array([[0.9, 0.1]]), np.array([1]))
    csv, sheet = li.write(worst, ["cat", "dog"], tmp_path, tmp_path / "reports")
    lines = csv.read_text().splitlines()
    assert lines[0] == ",".join(li.COLUMNS)
    assert lines[1].startswith("1,test,dog/b.png; dog/b2.png,b,dog,cat,0.1,0.9,-0.8")
    assert lines[2].startswith("2,val,cat/a.png,a,cat,dog,0.2,0.8,-0.6")
    assert Image.open(tmp_path / "reports" / LABEL_ISSUES_PNG).format == "PNG"
    # both returned, for the harness to log under reports/ (train's Stage.keep)
    assert (csv.name, sheet.name) == (LABEL_ISSUES_CSV, LABEL_ISSUES_PNG)

    off, _ = li.write(li.Worst(0), ["cat", "dog"], tmp_path, tmp_path / "reports")
    assert off.read_text().splitlines() == [",".join(li.COLUMNS)]  # header only
    assert (tmp_path / "reports" / LABEL_ISSUES_PNG).is_file()  # DVC's declared plot
