"""The candidate and the @production version, evaluated on the same current test split.

Each version is evaluated through what it would serve: its registered pyfunc
artifacts (the ONNX or LiteRT file and its `serving.json`) run by `Predictor`, so it
decodes, resizes and normalises the stored image bytes as it does when served, with
its own classes, size and normalisation. Predictions are mapped to the current
split's classes by name: a class the version does not know is always wrong for it.

Both see the same images, the test split read batch by batch, minus the images
either version's training held (`trained_hashes`). Only small per-image arrays are
kept, so memory stays flat in the split's size.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfmlops import evaluation as ev
from tfmlops.artifacts import (
    CONFUSION_PNG,
    EVALUATED_CSV,
    PREPARED_MANIFEST,
    RELIABILITY_PNG,
    TAG_LINEAGE_DATA,
    TAG_LINEAGE_RUN,
    data_version,
    read_manifest,
)
from tfmlops.errors import DataError
from tfmlops.files import write_csv

log = logging.getLogger(__name__)
UNKNOWN_MANIFEST = "unknown:"


@dataclass(frozen=True)
class Predictions:
    """One version on the evaluated images, in split order (per image: small arrays)."""

    version: str
    runtime: str
    sha256: list[str]
    labels: np.ndarray  # index into the current split's classes
    predicted: np.ndarray  # same indices; -1: a class the split does not have
    confidence: np.ndarray  # the top probability

    @property
    def correct(self) -> np.ndarray:
        return self.predicted == self.labels


def evaluate_versions(cfg, registry, candidate: str, production: str | None, out_dir: Path) -> dict:
    """Both versions on the same images: the summary promote's gate reads (also written
    with its plots and the per-image table to `out_dir`; "files" lists them)."""
    versions = {"candidate": candidate} | ({"production": production} if production else {})
    summary, runs = evaluate_together(cfg, registry, versions, out_dir)
    if "production" in runs:
        summary["paired"] = ev.paired_interval(runs["candidate"].correct, runs["production"].correct,
                                               cfg.promote.gate.confidence)
    return summary


def evaluate_together(cfg, registry, versions: dict[str, str], out_dir: Path
             ) -> tuple[dict, dict[str, Predictions]]:
    """(the summary, each version's Predictions), both by role (`versions`: role ->
    version; the first one's images and labels head the per-image table): every
    version on the same test images, minus those any of them trained or validated on."""
    prepared = Path(cfg.paths.prepared)
    manifest = read_manifest(prepared)
    classes = list(manifest["classes"])
    with tempfile.TemporaryDirectory(prefix="tfmlops-promote-") as tmp:
        # left out: what any of them trained or validated on (an older candidate, named
        # with --version, may have trained on today's test images as well)
        found = [trained_hashes(registry, v, data_version(prepared), Path(tmp) / role)
                 for role, v in versions.items()]
        excluded = set().union(*(held for held, _ in found))
        exclusion = "; ".join(how for _, how in found)
        unknown = [how for _, how in found if how.startswith(UNKNOWN_MANIFEST)]
        predictors = {role: served_predictor(registry, v, Path(tmp) / role) for role, v in versions.items()}
        runs = predict_split(predictors, versions, prepared, classes, lambda sha: sha not in excluded)
    first = next(iter(runs.values()))
    summary = {"images": len(first.sha256),
               "excluded": int(manifest["split_counts"]["test"]) - len(first.sha256),
               "exclusion": exclusion, "exclusion_unknown": unknown, "classes": classes}
    for role, p in runs.items():
        summary[role] = {"version": p.version, "runtime": p.runtime,
                         **ev.summarize(p.labels, p.predicted, p.confidence, classes)}
    summary["slices"] = ev.slices(slice_keys(first, classes, manifest),
                                  {role: p.correct for role, p in runs.items()})
    summary["files"] = write_outputs(out_dir, summary, runs, classes)
    return summary, runs


def trained_hashes(registry, version: str, current_data: str, dest: Path) -> tuple[set[str], str]:
    """(sha256 of the images `version` trained or validated on, how they were found): none
    when it was trained on this data version (its train/val are today's, apart from test);
    else its prepare run's manifest (`lineage.run.prepare` -> `prepared/manifest.json`)."""
    tags = registry.tags(version)
    if tags.get(TAG_LINEAGE_DATA) == current_data:
        return set(), (f"version {version} was trained on this data version ({current_data}): "
                       "its test images are this test split")
    run_id = tags.get(TAG_LINEAGE_RUN + "prepare")
    if run_id and run_id != "none":
        path = registry.run_artifact(run_id, PREPARED_MANIFEST, dest / "lineage")
        if path is not None:
            files = json.loads(path.read_text()).get("files", [])
            held = {f["sha256"] for f in files if f.get("split") in ("train", "val")}
            return held, f"version {version}'s prepare run {run_id}: {len(held)} train/val images"
    log.warning("promote: version %s names no prepare run whose manifest is in the store: "
                "its training images cannot be left out of the test split", version)
    return set(), f"{UNKNOWN_MANIFEST} version {version}'s training manifest is not in the store"


def predict_split(predictors: dict, versions: dict[str, str], prepared: Path,
                  classes: list[str], keep) -> dict[str, Predictions]:
    """Every version's served model (`predictors` by role) over the kept test images, in
    one pass over the stored bytes: the same images for all, by construction."""
    from tfmlops.data.stored_split import stored_records

    index = {name: i for i, name in enumerate(classes)}
    to_split = {role: np.array([index.get(name, -1) for name in p.classes]) for role, p in predictors.items()}
    shas, labels = [], []
    predicted: dict[str, list] = {role: [] for role in predictors}
    confidence: dict[str, list] = {role: [] for role in predictors}
    for batch_shas, encoded, batch_labels in stored_records(prepared, "test"):
        chosen = [i for i, sha in enumerate(batch_shas) if keep(sha)]
        if not chosen:
            continue
        shas.extend(batch_shas[i] for i in chosen)
        labels.append(batch_labels[chosen])
        for role, p in predictors.items():
            probs = p.probabilities(np.stack([p.image_input(encoded[i]) for i in chosen]))
            predicted[role].append(to_split[role][probs.argmax(axis=1)])
            confidence[role].append(probs.max(axis=1).astype(np.float32))

    def joined(parts: list, dtype) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    return {role: Predictions(versions[role], p.runtime, shas, joined(labels, np.int64),
                              joined(predicted[role], np.int64),
                              joined(confidence[role], np.float32))
            for role, p in predictors.items()}


def served_predictor(registry, version: str, dest: Path):
    """The `Predictor` of `version`'s registered pyfunc model (its runtime file and
    serving.json, as `mlflow models serve` would load them; no code of the version runs)."""
    import yaml

    from tfmlops.serving.predictor import CONFIG_ARTIFACT, MODEL_ARTIFACT, Predictor

    folder = registry.download_version(version, dest)
    flavor = yaml.safe_load((folder / "MLmodel").read_text())["flavors"]["python_function"]
    files = {name: folder / spec["path"] for name, spec in flavor.get("artifacts", {}).items()}
    if MODEL_ARTIFACT not in files or CONFIG_ARTIFACT not in files:
        raise DataError(f"version {version} of {registry.name} is not a tfmlops serving model (no "
                        "model and config artifacts); promote versions `tfmlops export` registered")
    return Predictor.from_files(files[MODEL_ARTIFACT], files[CONFIG_ARTIFACT])


def slice_keys(p: Predictions, classes: list[str], manifest: dict) -> dict[str, list[str]]:
    """Per evaluated image: its class, source format and source-size bucket (the
    manifest's `format`, `width`, `height` by sha256; "unknown" where it has none)."""
    rows = {f["sha256"]: f for f in manifest.get("files", []) if f.get("split") == "test"}
    meta = [rows.get(sha, {}) for sha in p.sha256]
    return {"class": [classes[i] for i in p.labels],
            "format": [str(m.get("format") or ev.UNKNOWN).lower() for m in meta],
            "source_size": [ev.size_bucket(m.get("width"), m.get("height")) for m in meta]}


def write_outputs(out_dir: Path, summary: dict, runs: dict[str, Predictions],
                  classes: list[str]) -> list[str]:
    """Write the reliability diagram, a confusion matrix per version and the per-image table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [ev.reliability_png({f"{role} v{summary[role]['version']}": summary[role]
                                 for role in runs}, out_dir / RELIABILITY_PNG),
             *(ev.confusion_png(**summary[role]["confusion"],
                                title=f"{role} version {summary[role]['version']}",
                                path=out_dir / CONFUSION_PNG.format(version=role))
               for role in runs)]
    first = next(iter(runs.values()))
    names = [*classes, ev.UNKNOWN]  # a prediction of -1 (a class the split lacks): the last
    rows = ({"sha256": sha, "label": classes[first.labels[i]],
             **{f"{role}_predicted": names[p.predicted[i]] for role, p in runs.items()},
             **{f"{role}_confidence": f"{p.confidence[i]:.6f}" for role, p in runs.items()}}
            for i, sha in enumerate(first.sha256))
    columns = ["sha256", "label", *[f"{r}_{k}" for r in runs for k in ("predicted", "confidence")]]
    files.append(write_csv(out_dir / EVALUATED_CSV, rows, columns))
    return [str(f) for f in files]
