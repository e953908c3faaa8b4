"""The promotion gate as data, and the parity measure (pure functions, no MLflow)."""

from __future__ import annotations

import numpy as np
import pytest

from tfmlops.config import GateConfig
from tfmlops.gate import VersionMetrics, evaluate_gate
from tfmlops.serving.parity import compare

GATE = GateConfig(min_accuracy=0.9, max_regression=0.01, max_size_bytes=1000,
                  max_latency_ms=5.0, require_parity=True)


def version(v="2", accuracy=0.95, size=500.0, latency=1.0, parity=True):
    return VersionMetrics(v, accuracy, size, latency, parity)


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_good_candidate_passes_every_check():
    checks = evaluate_gate(GATE, version(), version("1", accuracy=0.95))
    assert all(c.passed for c in checks)
    assert set(by_name(checks)) == {"min_accuracy", "max_regression", "max_size_bytes",
                                    "max_latency_ms", "parity"}


def test_without_production_the_regression_check_has_nothing_to_compare():
    check = by_name(evaluate_gate(GATE, version(), None))["max_regression"]
    assert check.passed and "nothing to compare" in check.message


@pytest.mark.parametrize("candidate, failing, words", [
    (version(accuracy=0.85), "min_accuracy", "short by 0.0500"),
    (version(size=1500), "max_size_bytes", "over by 500"),
    (version(latency=7.5), "max_latency_ms", "over by 2.500"),
    (version(parity=False), "parity", "failed"),
    (version(parity=None), "parity", "not recorded"),
])
def test_each_budget_refuses_and_says_by_how_much(candidate, failing, words):
    checks = by_name(evaluate_gate(GATE, candidate, None))
    assert not checks[failing].passed
    assert words in checks[failing].message
    assert [n for n, c in checks.items() if not c.passed] == [failing]


def test_a_regression_beyond_the_tolerance_is_refused():
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
    gate = GateConfig(**{**GATE.__dict__, "require_parity": False})
    assert by_name(evaluate_gate(gate, version(parity=False), None))["parity"].passed


def test_missing_tags_fail_the_checks_that_need_them():
    bare = VersionMetrics.from_tags("7", {})
    failed = {c.name for c in evaluate_gate(GATE, bare, None) if not c.passed}
    assert failed == {"min_accuracy", "max_size_bytes", "max_latency_ms", "parity"}


def test_metrics_come_from_the_tags_export_writes():
    m = VersionMetrics.from_tags("3", {"serving.accuracy": "0.97", "serving.bytes": "1234",
                                       "serving.latency_p50_ms": "0.5", "parity.passed": "true"})
    assert (m.accuracy, m.bytes, m.latency_ms, m.parity) == (0.97, 1234.0, 0.5, True)


def test_parity_needs_both_tolerance_and_identical_top1():
    ref = np.array([[0.7, 0.3], [0.4, 0.6]], np.float32)
    assert compare("onnx", ref, ref + 1e-6, atol=1e-4).passed
    far = compare("onnx", ref, ref + np.array([[0.01, -0.01], [0.0, 0.0]]), atol=1e-4)
    assert not far.passed and "over by" in far.describe()
    flipped = compare("onnx", ref, np.array([[0.7, 0.3], [0.6, 0.4]], np.float32), atol=1.0)
    assert not flipped.passed and flipped.top1_mismatches == 1
