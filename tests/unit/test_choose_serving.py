"""export's choice of the served runtime: the fastest of ONNX and TFLite among those whose
outputs matched Keras (parity), never one that failed it, and none at all said in one line.
Parities come from `skew.compare` on real probability arrays."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.errors import DataError
from tfmlops.stages.export import skew
from tfmlops.stages.export.formats import choose_serving

REFERENCE = np.array([[0.9, 0.1], [0.2, 0.8]], np.float32)
OFF = np.array([[0.1, 0.9], [0.2, 0.8]], np.float32)  # a different top-1 on the first image


def rows(p50: dict[str, float]) -> list[dict]:
    return [{"format": name, "file": f"{name}.bin", "bytes": 10 * k, "accuracy": 0.9, "p50_ms": ms}
            for k, (name, ms) in enumerate(p50.items(), 1)]


def parities(passed: dict[str, bool]) -> list:
    return [skew.compare(name, REFERENCE, REFERENCE if ok else OFF, 1e-3)
            for name, ok in passed.items()]


@settings(max_examples=60, deadline=None)
@given(p50=st.fixed_dictionaries({name: st.floats(0.01, 100) for name in
                                  ("keras", "saved_model", "onnx", "tflite")}),
       passed=st.fixed_dictionaries({name: st.booleans() for name in
                                     ("saved_model", "onnx", "tflite")}))
def test_the_fastest_runtime_that_passed_parity_is_served(p50, passed):
    eligible = {name: ms for name, ms in p50.items() if name in ("onnx", "tflite") and passed[name]}
    if not eligible:
        with pytest.raises(DataError, match="passed parity"):
            choose_serving(rows(p50), parities(passed))
        return
    chosen = choose_serving(rows(p50), parities(passed))
    assert passed[chosen["runtime"]]  # never one that failed parity
    assert chosen["latency_p50_ms"] == p50[chosen["runtime"]] == min(eligible.values())
    assert chosen["file"] == f"{chosen['runtime']}.bin"


def test_keras_and_the_saved_model_are_never_served_even_when_fastest():
    chosen = choose_serving(rows({"keras": 0.1, "saved_model": 0.1, "onnx": 5.0, "tflite": 3.0}),
                            parities({"saved_model": True, "onnx": True, "tflite": True}))
    assert chosen["runtime"] == "tflite"
