"""`tfmlops compare A B`: two registered versions, or two MLflow runs, side by side.

Two versions of `promote.registered_model` are evaluated as promote's gate evaluates
them (versions.evaluate_together: each through what it would serve, on the same current test
images, minus those either trained on). The comparison names the params that differ
in their lineage runs, each metric's change B - A on those images, per class, and the
images whose prediction flipped: fixed (A wrong, B right), broken (A right, B wrong) or
changed (both wrong). MLflow's Compare Runs shows runs' params and metrics side by
side; nothing there compares two versions' answers image by image. Two runs (`--runs`,
or ids given): their params and metrics only.

The tables go to stdout (`--json`: the comparison as data). A `compare` MLflow run and
reports/compare/<A>-<B>/ keep compare.md and compare.html (thumbnails of the first
`--flipped` flipped images: PNG files beside the Markdown, inline in the HTML),
compare.json, the per-image table and the plots (compare_report.py writes them).
"""

from __future__ import annotations

import logging
import sys

from tfmlops import harness
from tfmlops.artifacts import (
    FLIPPED_DIR,
    TAG_ACCURACY,
    TAG_BYTES,
    TAG_COMPARE,
    TAG_LATENCY,
    TAG_LINEAGE_COMMIT,
    TAG_LINEAGE_DATA,
    TAG_LINEAGE_RUN,
    TAG_STAGE,
)
from tfmlops.errors import DataError
from tfmlops.stage_spec import PIPELINE, StageSpec

log = logging.getLogger(__name__)

COMPARE = StageSpec(name="compare", help="two registered versions (or runs) side by side",
                    output=None, run_in_reports=True)
FLIP_KINDS = ("broken", "fixed", "changed")  # listed in this order
EXPORT_TAGS = (TAG_ACCURACY, TAG_BYTES, TAG_LATENCY)  # as export measured each version
VERSION_TAGS = (TAG_LINEAGE_COMMIT, TAG_LINEAGE_DATA)  # where each version came from


def show_comparison(cfg, a: str, b: str, *, runs: bool = False, most: int = 50,
                    as_json: bool = False) -> dict | None:
    """The command: the comparison (`as_json`), else its tables on stdout. A and B are
    version numbers, or run ids (`runs`, or when neither is a number)."""
    from tfmlops.files import staging_dir, swap_in
    from tfmlops.stages.promote import compare_report as report

    kind, a, b = kind_of(a, b, runs)
    if most < 0:
        raise DataError(f"--flipped {most}: list 0 or more flipped images")
    if not cfg.tracking.enabled:
        raise DataError("compare reads the MLflow store: tracking.enabled is false in params.yaml")
    from tfmlops.registry import Registry

    registry = Registry(cfg)
    sides = [side(registry, kind, x) for x in (a, b)]  # an unknown one fails here, in one line
    final = COMPARE.run_dir(cfg) / (f"{a}-{b}" if kind == "versions" else f"runs-{a[:8]}-{b[:8]}")
    names = {"kind": kind, "a": a, "b": b} | ({"model": registry.name} if kind == "versions" else {})
    with harness.stage(cfg, COMPARE, params={"compare": names}) as st:
        out = staging_dir(final)
        result = (versions_compared(cfg, registry, sides, out, most) if kind == "versions"
                  else runs_compared(sides))
        report.write_comparison(out, result)
        swap_in(out, final)
        for path in sorted(final.iterdir()):  # files at the top, flipped/ as a folder
            st.run.log_artifact(path)
        st.run.log_metrics(report.run_metrics(result))
        st.run.set_tags({f"{TAG_COMPARE}{k}": v for k, v in names.items()})
        result["run_id"] = st.run.run_id
    result["report"] = str(final)
    log.info("compare: %s (%s)", report.headline(result), final)
    if as_json:
        return result
    sys.stdout.write(report.text(result) + "\n")
    return None


def kind_of(a: str, b: str, runs: bool) -> tuple[str, str, str]:
    """("versions" or "runs", A, B): two numbers are versions, unless `runs`."""
    numbers = a.isdigit() and b.isdigit()
    if numbers and not runs:
        a, b = str(int(a)), str(int(b))
    if a == b:
        raise DataError(f"compare needs two different versions or runs; got {a} twice")
    if numbers and not runs:
        return "versions", a, b
    if not runs and (a.isdigit() or b.isdigit()):
        raise DataError(f"compare {a} {b}: two version numbers or two run ids, not one of each")
    return "runs", a, b


def side(registry, kind: str, x: str) -> dict:
    """A version with its tags, or a run's record; DataError when the store has none."""
    from tfmlops.tracking import redact

    if kind == "versions":
        return {"version": x, "tags": registry.tags(x)}
    record = registry.run_record(x)
    if record is None:
        raise DataError(f"run {x} is not in the tracking store {redact(registry.uri)}; see the run ids "
                        "in the MLflow UI (or compare two version numbers without --runs)")
    return record


def versions_compared(cfg, registry, sides: list[dict], out, most: int) -> dict:
    """Two versions on the same images: params, metrics, per class, the flipped images
    (the first `most` with their source files and thumbnails in `out`/flipped)."""
    from tfmlops import evaluation as ev
    from tfmlops.stages.promote import compare_report as report
    from tfmlops.stages.promote.versions import evaluate_together

    a, b = sides
    summary, runs = evaluate_together(cfg, registry, {"a": a["version"], "b": b["version"]}, out)
    classes = summary["classes"]
    flips = flipped(runs["a"], runs["b"], classes)
    listed = flips[:most]
    report.illustrate(cfg.paths.prepared, listed, out, FLIPPED_DIR)
    sa, sb = summary["a"], summary["b"]
    metrics = [metric_row(k, sa[k], sb[k], f"these {summary['images']} images")
               for k in ("accuracy", "ece")]
    metrics += [metric_row(t, _number(a["tags"].get(t)), _number(b["tags"].get(t)), "at export")
                for t in EXPORT_TAGS]
    return {"kind": "versions", "model": registry.name,
            **{r: {"version": s["version"], "runtime": summary[r]["runtime"],
                   **{t: s["tags"].get(t) for t in VERSION_TAGS}}
               for r, s in zip("ab", sides, strict=True)},
            "images": summary["images"], "excluded": summary["excluded"],
            "exclusion": summary["exclusion"],
            "params": params_differ(registry, a["tags"], b["tags"]), "metrics": metrics,
            "paired": ev.paired_interval(runs["b"].correct, runs["a"].correct,
                                         cfg.promote.gate.confidence),
            "per_class": per_class_deltas(sa["per_class"], sb["per_class"]),
            "flipped": {"total": len(flips), **{k: sum(f["kind"] == k for f in flips)
                                                 for k in FLIP_KINDS}, "listed": listed}}


def runs_compared(sides: list[dict]) -> dict:
    """Two runs: the params that differ and every metric of either."""
    a, b = sides
    keys = sorted(a["metrics"].keys() | b["metrics"].keys())
    return {"kind": "runs",
            **{r: {"run_id": s["run_id"], "name": s["name"], "stage": s["tags"].get(TAG_STAGE)}
               for r, s in zip("ab", sides, strict=True)},
            "params": [{"stage": "run", **row} for row in differing(a["params"], b["params"])],
            "metrics": [metric_row(k, a["metrics"].get(k), b["metrics"].get(k), "run")
                        for k in keys]}


def flipped(a, b, classes: list[str]) -> list[dict]:
    """The images A and B answer differently (Predictions in the same order), broken
    first, then fixed, then changed; the most confident answer of B first in each."""
    from tfmlops.evaluation import UNKNOWN

    names = [*classes, UNKNOWN]  # a prediction of -1 (a class the split lacks): the last
    rows = []
    for i in (a.predicted != b.predicted).nonzero()[0]:
        kind = "fixed" if b.correct[i] else "broken" if a.correct[i] else "changed"
        rows.append({"kind": kind, "sha256": a.sha256[i], "label": classes[a.labels[i]],
                     "a_predicted": names[a.predicted[i]],
                     "a_confidence": round(float(a.confidence[i]), 6),
                     "b_predicted": names[b.predicted[i]],
                     "b_confidence": round(float(b.confidence[i]), 6)})
    return sorted(rows, key=lambda r: (FLIP_KINDS.index(r["kind"]), -r["b_confidence"], r["sha256"]))


def params_differ(registry, tags_a: dict, tags_b: dict) -> list[dict]:
    """Where the versions came from, and each lineage stage's run params, where they
    differ: [{stage, param, a, b}] ("-": not set on that side)."""
    rows = [{"stage": "version", "param": t, "a": tags_a.get(t, "-"), "b": tags_b.get(t, "-")}
            for t in VERSION_TAGS if tags_a.get(t) != tags_b.get(t)]
    for stage in PIPELINE:
        ids = [_run_id(tags.get(TAG_LINEAGE_RUN + stage)) for tags in (tags_a, tags_b)]
        if ids[0] == ids[1]:  # the same run, or neither has one
            continue
        records = [registry.run_record(i) if i else None for i in ids]
        if None in records:  # no run on one side, or not in this store: its params unknown
            rows.append({"stage": stage, "param": "(run)", **{
                r: "none" if i is None else i if rec else f"{i} (not in the store)"
                for r, i, rec in zip("ab", ids, records, strict=True)}})
            continue
        rows += [{"stage": stage, **row} for row in differing(records[0]["params"],
                                                              records[1]["params"])]
    return rows


def differing(a: dict, b: dict) -> list[dict]:
    return [{"param": k, "a": a.get(k, "-"), "b": b.get(k, "-")}
            for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def per_class_deltas(a: dict, b: dict) -> list[dict]:
    """Per class: its images, then recall, precision and f1 of A, of B and B - A."""
    rows = []
    for name, ours in a.items():
        row = {"class": name, "images": ours["support"]}
        for k in ("recall", "precision", "f1"):
            row |= {f"{k}_a": ours[k], f"{k}_b": b[name][k], f"{k}_delta": _delta(ours[k], b[name][k])}
        rows.append(row)
    return rows


def metric_row(name: str, a, b, measured: str) -> dict:
    return {"metric": name, "a": a, "b": b, "delta": _delta(a, b), "measured": measured}


def _delta(a, b) -> float | None:
    return None if a is None or b is None else round(b - a, 6)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _run_id(value: str | None) -> str | None:
    return None if value in (None, "", "none") else value
