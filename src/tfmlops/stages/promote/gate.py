"""The promotion gate, written as data: checks of a candidate version against
absolute floors and ceilings (`promote.gate`) and against the version holding
@production. Pure functions of the registry's version tags and of the evaluation
of both versions on the same current test split (`versions.py`).
Without an evaluation, accuracy and the regression come from the tags export wrote
(each measured on its own split) and the per-class and calibration checks fail, unless
`promote.gate.evaluate` is false (then they are not applied).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfmlops.artifacts import TAG_ACCURACY, TAG_BYTES, TAG_EDGE_AGREEMENT, TAG_LATENCY, TAG_PARITY
from tfmlops.config import GateConfig


@dataclass(frozen=True)
class VersionMetrics:
    """What the gate reads from a version's tags (None: the tag is missing)."""

    version: str
    accuracy: float | None
    bytes: float | None
    latency_ms: float | None
    parity: bool | None
    edge_agreement: float | None = None

    @classmethod
    def from_tags(cls, version: str, tags: dict[str, str]) -> VersionMetrics:
        parity = tags.get(TAG_PARITY)
        parity = None if parity is None else parity.strip().lower() == "true"
        return cls(str(version), _number(tags.get(TAG_ACCURACY)), _number(tags.get(TAG_BYTES)),
                   _number(tags.get(TAG_LATENCY)), parity, _number(tags.get(TAG_EDGE_AGREEMENT)))


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    value: float | bool | None
    limit: float | bool | None
    message: str
    # Not passed, yet not shown worse: the evidence cannot decide (a person can).
    inconclusive: bool = False


def outcome(checks: list[Check]) -> str:
    """"passed", "refused" (a check failed) or "inconclusive" (only undecided checks)."""
    failed = [c for c in checks if not c.passed]
    if any(not c.inconclusive for c in failed):
        return "refused"
    return "inconclusive" if failed else "passed"


def evaluate_gate(gate: GateConfig, candidate: VersionMetrics, production: VersionMetrics | None,
                  evaluation: dict | None = None) -> list[Check]:
    """Every check of the gate, passed or not, with its values and a one-line message.
    `evaluation`: {"candidate": summary, "production": summary or absent, "paired": ...}."""
    c = candidate
    ev = evaluation if evaluation and evaluation.get("images") else {}  # 0 images: none
    mine, theirs = ev.get("candidate"), ev.get("production") if production else None
    accuracy, tag, label = ((mine["accuracy"], "", f"accuracy on {mine['images']} test images")
                            if mine is not None else (c.accuracy, "serving.accuracy", "accuracy"))
    checks = [
        _bound("min_accuracy", c, accuracy, gate.min_accuracy, tag, at_least=True, label=label),
        _regression(gate, c, production, ev.get("paired")), *_evidence(gate, evaluation),
        _class_recall(gate, mine), _class_drop(gate, production, mine, theirs),
        _not_evaluated(gate, "max_ece", gate.max_ece) if mine is None else
        _bound("max_ece", c, mine["ece"], gate.max_ece, "", at_least=False,
               label="expected calibration error", spec=(".4f", "g")),
        _bound("max_size_bytes", c, c.bytes, gate.max_size_bytes, "serving.bytes",
               at_least=False, label="size", unit=" bytes", spec=(",.0f", ",")),
        _bound("max_latency_ms", c, c.latency_ms, gate.max_latency_ms, "serving.latency_p50_ms",
               at_least=False, label="p50 latency", unit=" ms", spec=(".3f", "g"))]
    what = {True: "passed", False: "failed", None: "were not recorded"}[c.parity]
    checks.append(Check("parity", c.parity is True, c.parity, True, f"parity checks {what} at export")
                  if gate.require_parity else Check("parity", True, c.parity, None, "parity not required"))
    if c.edge_agreement is None:
        checks.append(Check("min_edge_agreement", False, None, gate.min_edge_agreement,
                            f"version {c.version} has no 'edge.top1_agreement' tag (exported "
                            "from an edge.json without it?); run `dvc repro quantize export`"))
    else:
        checks.append(_bound("min_edge_agreement", c, c.edge_agreement, gate.min_edge_agreement, "",
                             at_least=True, label="INT8 edge file's top-1 agreement with the float model"))
    return checks


def _not_evaluated(gate: GateConfig, name: str, limit: float) -> Check:
    if not gate.evaluate:
        return Check(name, True, None, limit, f"{name} not applied (promote.gate.evaluate is false)")
    return Check(name, False, None, limit, f"{name}: the candidate was not evaluated on the "
                 "current test split")


def _class_recall(gate: GateConfig, mine: dict | None) -> Check:
    if mine is None:
        return _not_evaluated(gate, "min_class_recall", gate.min_class_recall)
    recalls = {k: v["recall"] for k, v in mine["per_class"].items() if v["recall"] is not None}
    if not recalls:
        return Check("min_class_recall", True, None, gate.min_class_recall, "no class to check")
    low = sorted((r, k) for k, r in recalls.items() if r < gate.min_class_recall)
    worst = min(recalls.values())
    text = (f"every class's recall >= min_class_recall {gate.min_class_recall:g} (lowest "
            f"{worst:.4f})" if not low else "recall below min_class_recall "
            f"{gate.min_class_recall:g}: " + ", ".join(f"class {k} {r:.4f}" for r, k in low))
    return Check("min_class_recall", not low, worst, gate.min_class_recall, text)


def _class_drop(gate: GateConfig, production: VersionMetrics | None, mine: dict | None,
                theirs: dict | None) -> Check:
    if production is None:
        return Check("max_class_drop", True, None, gate.max_class_drop,
                     "no other version holds @production: nothing to compare with")
    if mine is None or theirs is None:
        return _not_evaluated(gate, "max_class_drop", gate.max_class_drop)
    drops = {k: theirs["per_class"][k]["recall"] - v["recall"] for k, v in mine["per_class"].items()
             if v["recall"] is not None and theirs["per_class"].get(k, {}).get("recall") is not None}
    if not drops:
        return Check("max_class_drop", True, None, gate.max_class_drop, "no class to compare")
    over = sorted(((d, k) for k, d in drops.items() if d > gate.max_class_drop), reverse=True)
    worst = max(drops.values())
    text = (f"per-class recall vs production version {production.version}: largest drop "
            f"{worst:+.4f} <= max_class_drop {gate.max_class_drop:g}" if not over else
            f"recall fell by more than max_class_drop {gate.max_class_drop:g} vs production "
            f"version {production.version}: "
            + ", ".join(f"class {k} {theirs['per_class'][k]['recall']:.4f} -> "
                        f"{mine['per_class'][k]['recall']:.4f}" for _, k in over))
    return Check("max_class_drop", not over, round(worst, 6), gate.max_class_drop, text)


def _bound(name: str, v: VersionMetrics, value: float | None, limit: float, tag: str, *,
           at_least: bool, label: str, unit: str = "", spec: tuple[str, str] = (".4f", ".4f")
           ) -> Check:
    """A floor (`at_least`) or ceiling check of one tagged figure; `spec` formats
    (the value and the distance, the limit)."""
    if value is None:
        return _missing(name, v, tag)
    value_spec, limit_spec = spec
    ok = value >= limit if at_least else value <= limit
    op = (">=" if ok else "<") if at_least else ("<=" if ok else ">")
    text = f"{label} {value:{value_spec}}{unit} {op} {name} {limit:{limit_spec}}"
    if not ok:
        text += f" ({'short' if at_least else 'over'} by {abs(value - limit):{value_spec}})"
    return Check(name, ok, value, limit, text)


def _regression(gate: GateConfig, c: VersionMetrics, production: VersionMetrics | None,
                paired: dict | None) -> Check:
    """On the same images (`paired`) when both were evaluated, else from export's tags."""
    if production is None:
        return Check("max_regression", True, None, gate.max_regression,
                     "no other version holds @production: nothing to compare with")
    if paired is not None:
        return _paired(gate, production, paired)
    if c.accuracy is None or production.accuracy is None:
        return _missing("max_regression", c if c.accuracy is None else production, "serving.accuracy")
    # Each measured on its own split (promote.gate.evaluate: false): no interval, the
    # point estimate alone, never more than max_regression worse.
    change = c.accuracy - production.accuracy
    ok = change >= -gate.max_regression
    text = (f"accuracy {c.accuracy:.4f} vs production version {production.version} "
            f"{production.accuracy:.4f} (export's tags, each on its own split): change {change:+.4f}")
    if not ok:
        text += (f", worse by more than max_regression {gate.max_regression:g} "
                 f"(by {-change - gate.max_regression:.4f})")
    return Check("max_regression", ok, change, -gate.max_regression, text)


def _paired(gate: GateConfig, production: VersionMetrics, paired: dict) -> Check:
    """Non-inferiority, the burden of proof on the candidate: passed when the lower bound
    (evaluation.monotone_low) is >= -max_regression; refused when the point estimate is
    below it; else inconclusive."""
    from tfmlops.evaluation import monotone_low

    m, d = gate.max_regression, paired["difference"]
    low = monotone_low(paired["candidate_only"], paired["production_only"], paired["images"],
                       paired["confidence"])
    text = (f"accuracy change vs production version {production.version} on the same "
            f"{paired['images']} images: {d:+.4f} (better on {paired['candidate_only']}, worse "
            f"on {paired['production_only']}); {paired['confidence']:.0%} interval "
            f"[{paired['low']:+.4f}, {paired['high']:+.4f}]" + (f", monotone lower bound "
            f"{low:+.4f}" if low > paired["low"] + 1e-12 else ""))
    if d < -m:
        return Check("max_regression", False, round(d, 6), -m,
                     f"{text}: worse by more than max_regression {m:g} (by {-m - d:.4f})")
    if low >= -m:
        return Check("max_regression", True, round(low, 6), -m,
                     f"{text}: not worse by more than max_regression {m:g}")
    return Check("max_regression", False, round(low, 6), -m,
                 f"{text}: inconclusive, the interval reaches below -max_regression {m:g} "
                 "(a larger test split decides, or a person: `tfmlops approve` / `reject`)",
                 inconclusive=True)


def _evidence(gate: GateConfig, evaluation: dict | None) -> list[Check]:
    """Enough evaluated images, and none either version trained on left in by ignorance."""
    if not evaluation or "images" not in evaluation:
        return []
    n = evaluation["images"]
    checks = [Check("min_images", n >= gate.min_images, n, gate.min_images,
                    f"{n} evaluated test images {'>=' if n >= gate.min_images else '<'} "
                    f"min_images {gate.min_images}" + ("" if n >= gate.min_images else
                    ": inconclusive (a larger test split decides, or a person)"),
                    inconclusive=n < gate.min_images)]
    unknown = evaluation.get("exclusion_unknown") or []
    checks.append(Check("training_images_known", not unknown, len(unknown), 0,
                        "; ".join(unknown) + ": its training images may be in the test split, "
                        "so the comparison is biased: inconclusive" if unknown else
                        "both versions' training images are known (left out of the test split)",
                        inconclusive=bool(unknown)))
    return checks


def _missing(name: str, v: VersionMetrics, tag: str) -> Check:
    return Check(name, False, None, None,
                 f"version {v.version} has no '{tag}' tag (not registered by `tfmlops export`?)")


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
