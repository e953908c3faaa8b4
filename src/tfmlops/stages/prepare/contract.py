"""prepare's data contract (`data.contract`): the profile of what it wrote, the
near-duplicates across splits and the anomalies against the accepted reference.

Built from the tally of the write pass (`data.profile.Profile`, folded in from each
image's stored facts), so nothing is decoded twice and an incremental run profiles
what a cold one does. Writes reports/data_profile.json and the two CSVs dvc plots
shows; each finding is one warning line, or, where its severity param says error,
a DataError (one line, exit 2) naming it, its param and the fix. The profile file
is written first, so a failed run leaves what it found to read.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tfmlops.artifacts import DATA_PROFILE, DATA_PROFILE_CLASSES, DATA_PROFILE_FEATURES
from tfmlops.errors import DataError
from tfmlops.files import write_csv, write_json
from tfmlops.stages.prepare.data_profile import CLASSES_COLUMNS, FEATURES_COLUMNS, write_csvs
from tfmlops.stages.prepare.drift import anomalies, read_reference
from tfmlops.stages.prepare.leakage import find_leakage

log = logging.getLogger(__name__)
ACCEPT = "`tfmlops accept-reference`"


def check_contract(cfg, classes: list[str], tally) -> dict:
    """Write the profile (reports/), log or raise on what it finds; return the metrics
    prepare reports for it (none with data.contract.profile: false)."""
    reports = Path(cfg.paths.reports)
    files = (reports / DATA_PROFILE_CLASSES, reports / DATA_PROFILE_FEATURES)
    if tally.profile is None:  # declared outputs all the same: DVC expects them
        write_json(reports / DATA_PROFILE, {"profile": False})
        for path, columns in zip(files, (CLASSES_COLUMNS, FEATURES_COLUMNS), strict=True):
            write_csv(path, [], columns)
        return {}
    contract = cfg.data.contract
    store = cfg.data.store
    summary = tally.profile.summary(classes) | {"stored": {  # what the image facts were of
        "short_side": store.short_side or cfg.data.image_size, "channels": cfg.data.channels,
        "encoding": store.encoding, "jpeg_quality": store.jpeg_quality}}
    leakage = _leakage(contract.leakage, tally)
    reference = read_reference(contract.reference)
    found = []
    if reference is not None:
        for anomaly in anomalies(summary, reference, contract):
            severity = getattr(contract.severity, anomaly["kind"])
            if severity != "off":
                found.append({**anomaly, "severity": severity})
    profile = {"profile": True, **summary, "leakage": leakage,
               "checked_against": contract.reference if reference is not None else None,
               "anomalies": found}
    write_json(reports / DATA_PROFILE, profile)
    write_csvs(summary, *files)
    _act(found, leakage, contract)
    return {"leakage_pairs": leakage.get("pairs", 0), "leakage_share": leakage.get("share", 0.0),
            "anomalies": len(found)}


def _leakage(params, tally) -> dict:
    """data_profile.json's `leakage`: the near-duplicate pairs across splits, named (on
    Apache Beam, found by a worker: `tally.leakage`)."""
    if params.severity == "off":
        return {"searched": False}
    if tally.leakage is not None:
        return tally.leakage
    return leakage_report(params, tally.profile.phashes, tally.profile.split_index, tally.rows)


def leakage_report(params, phashes, split_index, rows) -> dict:
    """The `leakage` entry for images in write order: their pHashes, split indices and
    manifest rows (file, sha256, label, split, ...)."""
    found = find_leakage(phashes, split_index, params.max_distance, params.listed)
    pairs = [{"files": [rows[i][0], rows[j][0]], "labels": [rows[i][2], rows[j][2]],
              "splits": [rows[i][3], rows[j][3]], "distance": d} for i, j, d in found.listed]
    return {"searched": True, "max_distance": params.max_distance, "pairs": found.pairs,
            "leaked_images": found.leaked, "held_out_images": found.held_out,
            "share": found.share, "max_share": params.max_share, "listed": pairs}


def _act(found: list[dict], leakage: dict, contract) -> None:
    """One warning line per finding under warn; a DataError for the first under error."""
    errors = []
    for a in found:
        param = f"data.contract.severity.{a['kind']}"
        if a["severity"] == "error":
            errors.append(f"data contract: {a['kind']}: {a['message']} ({param}: error); if "
                          f"intended, accept this profile with {ACCEPT} and commit "
                          f"{contract.reference}, or set {param}: warn")
        else:
            log.warning(f"prepare: data contract: {a['kind']}: {a['message']} ({param}: warn)")
    if leakage.get("pairs"):
        first = leakage["listed"][0] if leakage["listed"] else None
        example = f", e.g. {first['files'][0]} ({first['splits'][0]}) and {first['files'][1]} " \
                  f"({first['splits'][1]}), distance {first['distance']}" if first else ""
        text = (f"data contract: leakage: {leakage['pairs']} near-duplicate pair(s) across "
                f"splits (pHash within data.contract.leakage.max_distance "
                f"{leakage['max_distance']} bits{example}); {leakage['share']:.1%} of the val/"
                f"test images have one")
        over = leakage["share"] > contract.leakage.max_share  # unrounded: max_share 0 is 0
        above = f"{text}, above data.contract.leakage.max_share {contract.leakage.max_share}"
        if over and contract.leakage.severity == "error":
            errors.insert(0, f"{above} (data.contract.leakage.severity: error); remove one image "
                          f"of each pair listed in reports/{DATA_PROFILE}, or raise the share")
        elif over:
            log.warning(f"prepare: {above}; the pairs are in reports/{DATA_PROFILE}")
        else:
            log.info(f"prepare: {text} (within data.contract.leakage.max_share)")
    if errors:
        more = f" (and {len(errors) - 1} more: reports/{DATA_PROFILE})" if len(errors) > 1 else ""
        raise DataError(errors[0] + more)


def log_profile(cfg, run) -> None:
    """The profile and its figure to the stage's run (tracking on: the figure is for it;
    dvc plots draws the CSVs)."""
    if not (cfg.data.contract.profile and cfg.tracking.enabled):
        return
    from tfmlops.stages.prepare.data_profile_plot import draw_profile

    reports = Path(cfg.paths.reports)
    run.log_artifact(reports / DATA_PROFILE, "data_profile")
    run.log_drawn(draw_profile, (reports / DATA_PROFILE,), "data_profile")
