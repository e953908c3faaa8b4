"""The compression frontier: one row per built TFLite variant, and the edge pick."""

from __future__ import annotations

from tfmlops.config.sections.quantize import BASE_VARIANTS, PRUNED_ONLY_VARIANTS

FRONTIER_COLUMNS = ("variant", "accuracy", "agreement", "bytes", "gzip_bytes", "p50_ms", "p95_ms")
SOURCES = ("pruned", "trained")  # the pruned model first: the pipeline's main product


def variants(src: str, chosen: list[str] | None = None) -> tuple[str, ...]:
    """The TFLite variants built from one source model, in frontier order: those of
    `chosen` (params' `quantize.variants`; None: all) that apply to it."""
    every = BASE_VARIANTS + (PRUNED_ONLY_VARIANTS if src == "pruned" else ())
    return every if chosen is None else tuple(v for v in every if v in chosen)


def required_names(required: list[str]) -> list[str]:
    """params' `quantize.required` (e.g. int8, qat_int8) as variant names of the pruned model."""
    return [f"pruned_{r}" for r in required]


def select_edge(rows: list[dict], reference_accuracy: float, budget: float,
                pick: str = "smallest") -> dict:
    """The smallest (or, with pick="fastest", the lowest-p50) variant within `budget`.

    Smallest in raw bytes (what the device loads); ties (pruning leaves the raw
    size unchanged) go to the more accurate, then the smaller gzipped.
    Fastest by p50 latency; ties go to the smaller.

    When none is within budget the most accurate one (then the smallest) is
    named, with `within_budget: false`, so the export stage still has a file.
    """
    if not rows:
        raise ValueError("no TFLite variant was built")
    floor = reference_accuracy - budget - 1e-9
    within = [r for r in rows if r["accuracy"] >= floor]
    if within:
        if pick == "fastest":
            best = min(within, key=lambda r: (r["p50_ms"], r["bytes"], -r["accuracy"]))
        else:
            best = min(within, key=lambda r: (r["bytes"], -r["accuracy"], r["gzip_bytes"]))
    else:
        best = max(rows, key=lambda r: (r["accuracy"], -r["bytes"]))
    return {
        "variant": best["variant"],
        "file": f"{best['variant']}.tflite",
        "accuracy": best["accuracy"],
        "agreement": best.get("agreement"),  # top-1 with the float Keras model (promote's gate)
        "bytes": best["bytes"],
        "gzip_bytes": best["gzip_bytes"],
        "reference_accuracy": reference_accuracy,
        "accuracy_budget": budget,
        "pick": pick,
        "p50_ms": best.get("p50_ms"),
        "within_budget": bool(within),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None
