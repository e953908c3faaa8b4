"""This run's data profile against a reference profile the user accepted: the anomalies.

The reference is a file (`data.contract.reference`) holding an accepted
`reports/data_profile.json` (`accept_reference` copies it there; the user commits it,
as TFX users curate a schema), or `{"reference": null}` while none is accepted yet:
then nothing is checked. Each anomaly is named as its severity param is
(`data.contract.severity.<kind>`): a class appeared or vanished, a class's share of
the images moved, a feature's histogram moved (Jensen-Shannon distance, base 2, 0 to
1, on the fixed bins of `data.profile.EDGES`), a source format not in the
reference, or the share of tiny images grew.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from tfmlops.errors import DataError
from tfmlops.files import write_bytes

log = logging.getLogger(__name__)
NO_REFERENCE = {"reference": None}
# of the stored image, not the source: another data.store (short side, channels,
# encoding) moves them with the data unchanged
STORED_FEATURES = ("brightness", "contrast", "saturation", "sharpness")


def js_distance(p, q) -> float:
    """Jensen-Shannon distance (base 2: 0 same, 1 disjoint) of two histograms (counts)."""
    sp, sq = sum(p), sum(q)
    if not sp or not sq:
        return 0.0 if sp == sq else 1.0
    p = [v / sp for v in p]
    q = [v / sq for v in q]
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]

    def kl(x):
        return sum(a * math.log2(a / b) for a, b in zip(x, m, strict=True) if a > 0)

    return math.sqrt(max(0.0, (kl(p) + kl(q)) / 2))


def read_reference(path: str | Path) -> dict | None:
    """The accepted profile at `path`, or None (no file, or `{"reference": null}`)."""
    path = Path(path)
    if not path.is_file():
        log.warning(f"prepare: no reference profile at {path} (data.contract.reference): "
                    "checking nothing; accept this run's with `tfmlops accept-reference`")
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise DataError(f"{path} (data.contract.reference) is not JSON ({exc}); restore it "
                        "or accept a profile again with `tfmlops accept-reference`") from None
    if data.get("reference", True) is None:
        log.info(f"prepare: no reference profile accepted yet ({path}): checking nothing; "
                 "accept this run's with `tfmlops accept-reference`, then commit the file")
        return None
    if "features" not in data:
        raise DataError(f"{path} (data.contract.reference) holds no profile; accept one with "
                        "`tfmlops accept-reference`")
    return data


def anomalies(now: dict, ref: dict, contract) -> list[dict]:
    """Every anomaly of profile `now` against `ref` under `contract` (its thresholds),
    each {"kind", "message"}; severities are applied by the caller."""
    found = []

    def add(kind: str, message: str, **facts) -> None:
        found.append({"kind": kind, "message": message, **facts})

    new, old = set(now["classes"]), set(ref["classes"])
    for c in sorted(new - old):
        add("class_appeared", f"class {c!r} is not in the reference profile", cls=c)
    for c in sorted(old - new):
        add("class_vanished", f"class {c!r} of the reference profile has no images", cls=c)
    for c in sorted(new & old):
        moved = now["class_share"][c] - ref["class_share"][c]
        if abs(moved) > contract.max_class_share_change:
            add("class_share", f"class {c!r} is {now['class_share'][c]:.1%} of the images, "
                f"{ref['class_share'][c]:.1%} in the reference (moved more than "
                f"data.contract.max_class_share_change {contract.max_class_share_change})",
                cls=c, change=round(moved, 4))
    restored = now.get("stored") != ref.get("stored")
    for feature, hist in now["features"].items():
        if feature == "format" or feature not in ref["features"] \
                or now["edges"].get(feature) != ref["edges"].get(feature) \
                or (restored and feature in STORED_FEATURES):
            continue  # bins or storage of another run: not comparable, accept a new one
        then = ref["features"][feature]
        if isinstance(hist, dict):  # a category's counts by value: over the values of both
            keys = sorted(set(hist) | set(then))
            hist, then = [hist.get(k, 0) for k in keys], [then.get(k, 0) for k in keys]
        distance = js_distance(hist, then)
        if distance > contract.max_feature_distance:
            add("feature_drift", f"{feature}'s histogram moved: Jensen-Shannon distance "
                f"{distance:.3f} to the reference's (above data.contract.max_feature_distance "
                f"{contract.max_feature_distance})", feature=feature, distance=round(distance, 4))
    for fmt in sorted(set(now["features"]["format"]) - set(ref["features"]["format"])):
        add("new_format", f"{now['features']['format'][fmt]} image(s) of format {fmt}, "
            "not in the reference profile", format=fmt)
    grew = now["tiny"]["share"] - ref["tiny"]["share"]
    if grew > contract.tiny.max_share_change and now["tiny"]["side"] == ref["tiny"]["side"]:
        add("tiny_images", f"{now['tiny']['share']:.1%} of the images have a short side below "
            f"{now['tiny']['side']} px (data.contract.tiny.side), {ref['tiny']['share']:.1%} "
            f"in the reference (grew more than data.contract.tiny.max_share_change "
            f"{contract.tiny.max_share_change})", share=round(now["tiny"]["share"], 4))
    return found


def accept_reference(profile: str | Path, reference: str | Path) -> dict:
    """Copy this run's profile to the reference file: later runs are checked against it."""
    profile, reference = Path(profile), Path(reference)
    if not profile.is_file():
        raise DataError(f"{profile} not found; run `dvc repro prepare` first")
    raw = profile.read_bytes()
    data = json.loads(raw)
    if data.get("profile") is False:
        raise DataError(f"{profile} holds no profile (data.contract.profile: false); turn the "
                        "profile on and run `dvc repro prepare` first")
    write_bytes(reference, raw)
    log.info(f"accept-reference: {profile} -> {reference}; commit it (git add {reference}) "
             "so every later prepare is checked against it")
    return {"reference": str(reference), "images": data.get("images")}
