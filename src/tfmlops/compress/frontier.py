"""The compression frontier: one row per built TFLite variant, and the edge pick."""

from __future__ import annotations

FRONTIER_COLUMNS = ("variant", "accuracy", "agreement", "bytes", "gzip_bytes", "p50_ms", "p95_ms")
SOURCES = ("pruned", "trained")  # the pruned model first: the pipeline's main product
BASE_VARIANTS = ("float32", "dynamic", "float16", "int8")
QAT_VARIANT = "pruned_qat_int8"


def required_names(required: list[str]) -> list[str]:
    """params' `quantize.required` (e.g. int8, qat_int8) as variant names of the pruned model."""
    return [f"pruned_{r}" for r in required]


def select_edge(rows: list[dict], reference_accuracy: float, budget: float) -> dict:
    """The smallest variant within `budget` of the Keras reference's accuracy.

    Smallest in raw bytes (what the device loads); ties (pruning leaves the raw
    size unchanged) go to the more accurate, then the smaller gzipped.

    When none is within budget the most accurate one (then the smallest) is
    named, with `within_budget: false`, so the export stage still has a file.
    """
    if not rows:
        raise ValueError("no TFLite variant was built")
    floor = reference_accuracy - budget - 1e-9
    within = [r for r in rows if r["accuracy"] >= floor]
    if within:
        best = min(within, key=lambda r: (r["bytes"], -r["accuracy"], r["gzip_bytes"]))
    else:
        best = max(rows, key=lambda r: (r["accuracy"], -r["bytes"]))
    return {
        "variant": best["variant"],
        "file": f"{best['variant']}.tflite",
        "accuracy": best["accuracy"],
        "bytes": best["bytes"],
        "gzip_bytes": best["gzip_bytes"],
        "reference_accuracy": reference_accuracy,
        "accuracy_budget": budget,
        "within_budget": bool(within),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None
