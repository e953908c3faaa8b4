"""The promotion gate, written as data: checks of a candidate version against
absolute floors and ceilings (`promote.gate`) and against the version holding
@production. Pure functions of the registry's version tags; `stages/promote.py`
applies the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfmlops.config import GateConfig


@dataclass(frozen=True)
class VersionMetrics:
    """What the gate reads from a version's tags (None: the tag is missing)."""

    version: str
    accuracy: float | None
    bytes: float | None
    latency_ms: float | None
    parity: bool | None

    @classmethod
    def from_tags(cls, version: str, tags: dict[str, str]) -> VersionMetrics:
        from tfmlops.artifacts import TAG_ACCURACY, TAG_BYTES, TAG_LATENCY, TAG_PARITY

        parity = tags.get(TAG_PARITY)
        return cls(str(version), _number(tags.get(TAG_ACCURACY)), _number(tags.get(TAG_BYTES)),
                   _number(tags.get(TAG_LATENCY)),
                   None if parity is None else parity.strip().lower() == "true")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    value: float | bool | None
    limit: float | bool | None
    message: str


def evaluate_gate(gate: GateConfig, candidate: VersionMetrics,
                  production: VersionMetrics | None) -> list[Check]:
    """Every check of the gate, passed or not, with its values and a one-line message."""
    c = candidate
    checks = []
    checks.append(_bound("min_accuracy", c, c.accuracy, gate.min_accuracy, "serving.accuracy",
                         at_least=True, label="accuracy", unit="", spec=(".4f", ".4f")))
    checks.append(_regression(gate, c, production))
    checks.append(_bound("max_size_bytes", c, c.bytes, gate.max_size_bytes, "serving.bytes",
                         at_least=False, label="size", unit=" bytes", spec=(",.0f", ",")))
    checks.append(_bound("max_latency_ms", c, c.latency_ms, gate.max_latency_ms,
                         "serving.latency_p50_ms", at_least=False, label="p50 latency",
                         unit=" ms", spec=(".3f", "g")))
    if not gate.require_parity:
        checks.append(Check("parity", True, c.parity, None, "parity not required"))
    else:
        ok = c.parity is True
        what = {True: "passed", False: "failed", None: "were not recorded"}[c.parity]
        checks.append(Check("parity", ok, c.parity, True, f"parity checks {what} at export"))
    return checks


def _bound(name: str, v: VersionMetrics, value: float | None, limit: float, tag: str, *,
           at_least: bool, label: str, unit: str, spec: tuple[str, str]) -> Check:
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


def _regression(gate: GateConfig, c: VersionMetrics, production: VersionMetrics | None) -> Check:
    if production is None:
        return Check("max_regression", True, None, gate.max_regression,
                     "no other version holds @production: nothing to compare with")
    if c.accuracy is None or production.accuracy is None:
        return _missing("max_regression", c if c.accuracy is None else production,
                        "serving.accuracy")
    change = c.accuracy - production.accuracy
    ok = change >= -gate.max_regression
    text = (f"accuracy {c.accuracy:.4f} vs production version {production.version} "
            f"{production.accuracy:.4f}: change {change:+.4f}")
    if not ok:
        text += (f", worse by more than max_regression {gate.max_regression:g} "
                 f"(by {-change - gate.max_regression:.4f})")
    return Check("max_regression", ok, change, -gate.max_regression, text)


def _missing(name: str, v: VersionMetrics, tag: str) -> Check:
    return Check(name, False, None, None,
                 f"version {v.version} has no '{tag}' tag (not registered by `tfmlops export`?)")


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
