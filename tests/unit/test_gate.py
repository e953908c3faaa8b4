"""The promotion gate as data, and the parity measure (pure functions, no MLflow)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.config import GateConfig, replace
from tfmlops.evaluation import paired_interval, summarize
from tfmlops.stages.export.skew import compare
from tfmlops.stages.promote.gate import VersionMetrics, evaluate_gate, outcome

GATE = GateConfig(min_accuracy=0.9, max_regression=0.01, max_size_bytes=1000,
                  max_latency_ms=5.0, require_parity=True)
CLASSES = list("abcdefghij")


def version(v="2", accuracy=0.95, size=500.0, latency=1.0, parity=True, agreement=0.99):
    return VersionMetrics(v, accuracy, size, latency, parity, agreement)


def predictions(correct_per_class: list[int], per_class: int = 25):
    """Labels and predictions with `correct_per_class[k]` of class k's images right (the
    wrong ones predicted as the next class), confidence 0.99 when right, 0.3 when wrong."""
    labels = np.repeat(np.arange(len(correct_per_class)), per_class)
    right = np.concatenate([np.arange(per_class) < n for n in correct_per_class])
    predicted = np.where(right, labels, (labels + 1) % len(correct_per_class))
    return labels, predicted, np.where(right, 0.99, 0.3)


def evaluation(candidate: list[int], production: list[int] | None = None) -> dict:
    """The evaluation summary the gate reads, from per-class counts of right images."""
    y, p_cand, conf = predictions(candidate)
    out = {"images": len(y), "candidate": summarize(y, p_cand, conf, CLASSES)}
    if production is not None:
        _, p_prod, conf_p = predictions(production)
        out["production"] = summarize(y, p_prod, conf_p, CLASSES)
        out["paired"] = paired_interval(p_cand == y, p_prod == y, 0.95)
    return out


def gate_of(candidate, production=None, ev: dict | None = None, gate=GATE):
    """The checks with a well-calibrated, even evaluation unless `ev` is given."""
    ev = ev or evaluation([24] * 10, [24] * 10 if production else None)
    return by_name(evaluate_gate(gate, candidate, production, ev))


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_good_candidate_passes_every_check():
    checks = evaluate_gate(GATE, version(), version("1", accuracy=0.95),
                           evaluation([24] * 10, [24] * 10))
    assert all(c.passed for c in checks), [c.message for c in checks if not c.passed]
    assert set(by_name(checks)) == {"min_accuracy", "max_regression", "min_class_recall",
                                    "max_class_drop", "max_ece", "max_size_bytes",
                                    "max_latency_ms", "parity", "min_edge_agreement",
                                    "min_images", "training_images_known"}


def test_without_production_the_paired_checks_have_nothing_to_compare():
    checks = gate_of(version(), None)
    for name in ("max_regression", "max_class_drop"):
        assert checks[name].passed and "nothing to compare" in checks[name].message


def test_equal_on_average_but_one_class_lost_is_refused():
    """Both miss 25 of 250 images: production a few of every class, the candidate all of
    class j. The paired check cannot tell (18 images each way); the class checks refuse."""
    ev = evaluation([25] * 9 + [0], [23] * 9 + [18])
    assert ev["candidate"]["accuracy"] == ev["production"]["accuracy"] == 0.9
    checks = gate_of(version(), version("1"), ev)
    assert checks["max_regression"].inconclusive and checks["min_accuracy"].passed
    assert {n for n, c in checks.items() if not c.passed} == {"min_class_recall",
                                                              "max_class_drop", "max_regression"}
    assert outcome(list(checks.values())) == "refused"
    assert "class j 0.0000" in checks["min_class_recall"].message
    assert "class j 0.7200 -> 0.0000" in checks["max_class_drop"].message


def test_the_burden_of_proof_is_on_the_candidate():
    """Non-inferiority at max_regression 0.01 on 250 images: worse on 2 and better on none
    (-0.008; the interval's lower bound is the point estimate) passes; worse on 3 (-0.012)
    is refused on the point estimate; 3 each way (0.0, but [-0.0229, +0.0229]) cannot be
    shown not worse: inconclusive, which no one promotes automatically."""
    close = gate_of(version(), version("1"), evaluation([24] * 9 + [22], [24] * 10))
    assert close["max_regression"].passed and "worse on 2" in close["max_regression"].message
    assert outcome(list(close.values())) == "passed"
    worse = gate_of(version(), version("1"), evaluation([24] * 9 + [21], [24] * 10))
    assert not worse["max_regression"].passed and not worse["max_regression"].inconclusive
    assert "worse by more than max_regression 0.01 (by 0.0020)" in worse["max_regression"].message
    assert outcome(list(worse.values())) == "refused"
    y, p, conf = predictions([24] * 10)
    p_prod = p.copy()
    right = np.flatnonzero(p == y)
    p_prod[right[:3]] = (y[right[:3]] + 1) % 10  # production wrong on 3 the candidate has
    p_cand = p.copy()
    p_cand[right[-3:]] = (y[right[-3:]] + 1) % 10  # and the candidate on 3 others
    ev = {"images": len(y), "candidate": summarize(y, p_cand, conf, CLASSES),
          "production": summarize(y, p_prod, conf, CLASSES),
          "paired": paired_interval(p_cand == y, p_prod == y, 0.95)}
    tied = evaluate_gate(GATE, version(), version("1"), ev)
    check = by_name(tied)["max_regression"]
    assert check.inconclusive and "inconclusive" in check.message and "approve" in check.message
    assert outcome(tied) == "inconclusive"


def test_too_few_images_or_an_unknown_training_set_is_inconclusive():
    few = evaluation([24] * 10, [24] * 10)  # 250 images, but say 90 were evaluated
    few["images"] = 90
    checks = evaluate_gate(GATE, version(), version("1"), few)
    assert by_name(checks)["min_images"].inconclusive and outcome(checks) == "inconclusive"
    unknown = {**evaluation([24] * 10, [24] * 10),
               "exclusion_unknown": ["unknown: version 1's training manifest is not in the store"]}
    checks = evaluate_gate(GATE, version(), version("1"), unknown)
    assert by_name(checks)["training_images_known"].inconclusive
    assert outcome(checks) == "inconclusive"


@given(n=st.integers(1, 3000), data=st.data(),
       margin=st.floats(0.0, 0.01), confidence=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
@settings(max_examples=300, deadline=None)
def test_no_outcome_promotes_a_candidate_more_than_max_regression_worse(n, data, margin,
                                                                       confidence):
    """For any paired counts: passed only when the point estimate is at least
    -max_regression (so never more than 1 point worse); refused exactly when it is below;
    and one more image the candidate alone gets right never turns a pass into a refusal."""
    b = data.draw(st.integers(0, n))
    c = data.draw(st.integers(0, n - b))
    gate = replace(GATE, max_regression=margin, confidence=confidence, min_images=1)

    def result(b, c):
        cand = np.array([True] * b + [False] * c + [True] * (n - b - c))
        prod = np.array([False] * b + [True] * c + [True] * (n - b - c))
        paired = paired_interval(cand, prod, confidence)
        check = by_name(evaluate_gate(gate, version(), version("1"),
                                      {"images": n, "paired": paired}))["max_regression"]
        return ("passed" if check.passed else "inconclusive" if check.inconclusive
                else "refused"), paired["difference"]

    got, d = result(b, c)
    assert (got == "refused") == (d < -margin)
    if got == "passed":
        assert d >= -margin >= -0.01
    if b + c < n and got == "passed":  # one more right: still passed
        assert result(b + 1, c)[0] == "passed"
    if c > 0 and got == "passed":  # one fewer wrong: still passed
        assert result(b, c - 1)[0] == "passed"


def test_calibration_above_the_ceiling_is_refused():
    y, p, _ = predictions([24] * 10)
    ev = {"images": len(y), "candidate": summarize(y, p, np.full(len(y), 0.3), CLASSES)}
    check = gate_of(version(), None, ev)["max_ece"]
    assert not check.passed and check.value == pytest.approx(0.96 - 0.3)


def test_without_an_evaluation_the_tags_decide_accuracy_and_class_checks_fail():
    checks = by_name(evaluate_gate(GATE, version(accuracy=0.93), version("1", accuracy=0.95)))
    assert checks["min_accuracy"].passed and not checks["max_regression"].passed
    assert {n for n, c in checks.items() if not c.passed} == {
        "max_regression", "min_class_recall", "max_class_drop", "max_ece"}


@pytest.mark.parametrize("candidate, right, failing, words", [
    (version(), [22] * 10, "min_accuracy", "short by 0.0200"),
    (version(agreement=0.9), [24] * 10, "min_edge_agreement", "short by 0.0700"),
    (version(size=1500), [24] * 10, "max_size_bytes", "over by 500"),
    (version(latency=7.5), [24] * 10, "max_latency_ms", "over by 2.500"),
    (version(parity=False), [24] * 10, "parity", "failed"),
    (version(parity=None), [24] * 10, "parity", "not recorded"),
])
def test_each_budget_refuses_and_says_by_how_much(candidate, right, failing, words):
    checks = gate_of(candidate, None, evaluation(right))
    assert not checks[failing].passed
    assert words in checks[failing].message
    assert [n for n, c in checks.items() if not c.passed] == [failing]


def test_a_regression_beyond_the_tolerance_is_refused():
    """Without an evaluation, the tags' accuracies (each on its own split) are compared."""
    checks = by_name(evaluate_gate(GATE, version(accuracy=0.93), version("1", accuracy=0.95)))
    check = checks["max_regression"]
    assert not check.passed
    assert check.value == pytest.approx(-0.02)
    assert "production version 1" in check.message and "by 0.0100" in check.message


def test_a_regression_within_the_tolerance_passes():
    check = by_name(evaluate_gate(GATE, version(accuracy=0.945),
                                  version("1", accuracy=0.95)))["max_regression"]
    assert check.passed


def test_parity_not_required_is_not_checked():
    gate = replace(GATE, require_parity=False)
    assert gate_of(version(parity=False), None, gate=gate)["parity"].passed


def test_missing_tags_fail_the_checks_that_need_them():
    bare = VersionMetrics.from_tags("7", {})
    failed = {c.name for c in evaluate_gate(GATE, bare, None) if not c.passed}
    assert failed == {"min_accuracy", "max_size_bytes", "max_latency_ms", "parity",
                      "min_edge_agreement", "min_class_recall", "max_ece"}


def test_metrics_come_from_the_tags_export_writes():
    m = VersionMetrics.from_tags("3", {"serving.accuracy": "0.97", "serving.bytes": "1234",
                                       "serving.latency_p50_ms": "0.5", "parity.passed": "true",
                                       "edge.top1_agreement": "0.99"})
    assert (m.accuracy, m.bytes, m.latency_ms, m.parity, m.edge_agreement) == (
        0.97, 1234.0, 0.5, True, 0.99)


def test_parity_needs_both_tolerance_and_identical_top1():
    ref = np.array([[0.7, 0.3], [0.4, 0.6]], np.float32)
    assert compare("onnx", ref, ref + 1e-6, atol=1e-4).passed
    far = compare("onnx", ref, ref + np.array([[0.01, -0.01], [0.0, 0.0]]), atol=1e-4)
    assert not far.passed and "over by" in far.describe()
    flipped = compare("onnx", ref, np.array([[0.7, 0.3], [0.6, 0.4]], np.float32), atol=1.0)
    assert not flipped.passed and flipped.top1_mismatches == 1
