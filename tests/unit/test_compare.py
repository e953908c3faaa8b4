"""`tfmlops compare`'s pure parts: which images flipped and how, which params differ,
what A and B are (tests/integration/test_promote.py runs the command on real versions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.errors import DataError
from tfmlops.stages.promote.compare import FLIP_KINDS, differing, flipped, kind_of
from tfmlops.stages.promote.versions import Predictions

CLASSES = ["cat", "dog", "fox"]
# per image: (label, A's prediction, B's prediction, B's confidence); -1: a class the
# version does not share with the split (always wrong)
images = st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 2), st.integers(-1, 2),
                            st.floats(0.0, 1.0, width=32)), min_size=1, max_size=200)


def predictions(version: str, rows, which: int) -> Predictions:
    return Predictions(version, "onnx", [f"{i:064x}" for i in range(len(rows))],
                       np.array([r[0] for r in rows]), np.array([r[which] for r in rows]),
                       np.array([r[3] for r in rows], np.float32))


@settings(max_examples=200, deadline=None)
@given(rows=images)
def test_the_flipped_images_are_those_answered_differently(rows):
    """Exactly the images whose predictions differ, each of the right kind, broken first,
    B's most confident first within a kind; fixed - broken is B's gain in right images."""
    a, b = predictions("1", rows, 1), predictions("2", rows, 2)
    flips = flipped(a, b, CLASSES)
    index = {sha: i for i, sha in enumerate(a.sha256)}
    assert {f["sha256"] for f in flips} == {a.sha256[i] for i in np.flatnonzero(a.predicted != b.predicted)}
    for f in flips:
        i = index[f["sha256"]]
        assert f["kind"] == ("fixed" if b.correct[i] else "broken" if a.correct[i] else "changed")
        assert f["label"] == CLASSES[a.labels[i]]
        assert f["b_predicted"] == (CLASSES[b.predicted[i]] if b.predicted[i] >= 0 else "unknown")
    counts = {k: sum(f["kind"] == k for f in flips) for k in FLIP_KINDS}
    assert counts["fixed"] - counts["broken"] == int(b.correct.sum()) - int(a.correct.sum())
    order = [(FLIP_KINDS.index(f["kind"]), -f["b_confidence"]) for f in flips]
    assert order == sorted(order)


def test_versions_or_runs_from_their_form():
    assert kind_of("3", "05", runs=False) == ("versions", "3", "5")
    assert kind_of("3", "5", runs=True) == ("runs", "3", "5")
    assert kind_of("ab12", "cd34", runs=False) == ("runs", "ab12", "cd34")
    for a, b, says in (("3", "03", "twice"), ("ab", "ab", "twice"), ("3", "ab12", "not one of each")):
        with pytest.raises(DataError, match=says):
            kind_of(a, b, runs=False)


def test_differing_lists_only_what_differs_and_what_one_side_lacks():
    assert differing({"seed": "1", "epochs": "2", "lr": "0.1"}, {"seed": "1", "epochs": "3",
                                                                 "width": "8"}) == [
        {"param": "epochs", "a": "2", "b": "3"}, {"param": "lr", "a": "0.1", "b": "-"},
        {"param": "width", "a": "-", "b": "8"}]
