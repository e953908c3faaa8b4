"""Stage `prepare`: validate images, split them, write TFRecords and statistics.

Streaming: each file is hashed, decoded, resized and written as it comes, by a
process pool (`data.workers`), so memory does not grow with the number of
images. Each image is stored with its short side at `data.store.short_side`
(default: `data.image_size`), as JPEG or PNG (`data.store.encoding`). Results
are cached by content hash (`paths.prepare_cache`): a rerun decodes only new
or changed files and writes the same bytes as a cold run.

Output (`paths.prepared`, built in a staging folder and swapped in whole):
TFRecord shards per split, `manifest.json` (label map, counts per class and
split, source and stored sizes, encodings, content hashes), `stats.json`
(per-channel mean and std of the train split at the model's input size),
`quarantine.json` and a copy of every rejected file.

This process imports neither TensorFlow (the TFRecords are written directly,
`data.tfrecords`) nor MLflow (the tracking sidecar keeps the run), so an
incremental run costs little more than its new files; the input pipeline is
profiled by `train`, which runs it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from collections import Counter
from pathlib import Path

from tfmlops import faults, tracking
from tfmlops.config import Config
from tfmlops.config.machine import allow_open_files
from tfmlops.data.images import SPLITS, check_empty_classes, list_files
from tfmlops.data.stream import prepare_stream
from tfmlops.errors import DataError
from tfmlops.files import hold_lock, staging_dir, swap_in, write_json

STAGE = "prepare"
log = logging.getLogger(__name__)


LOCK = "prepare.lock"  # in paths.prepare_cache: one prepare at a time per project


def run(cfg: Config) -> dict[str, float]:
    tracking.preflight(cfg)  # a dead server fails in seconds, before the scan
    allow_open_files(cfg.data.shards)  # every shard of the three splits stays open
    # The run's own process starts now and imports MLflow (3-4 s of CPU, most of an
    # incremental run) while this one lists, hashes and decodes, instead of after them.
    tracking.start_sidecar(cfg)
    try:
        lock = Path(cfg.paths.prepare_cache) / LOCK
        with hold_lock(lock, f"prepare: another prepare of this project is running (it holds "
                             f"{lock}); waiting for it to finish"):
            faults.point("prepare.locked")
            return _run(cfg)
    except BaseException:  # before its run took the sidecar over: it is closed, not left
        tracking.discard_sidecar()
        raise


def _run(cfg: Config) -> dict[str, float]:
    image_dir = Path(cfg.data.image_dir)
    listing = time.perf_counter()
    classes, files, refused = list_files(image_dir)
    list_seconds = time.perf_counter() - listing
    faults.point("prepare.listed")
    out = staging_dir(cfg.paths.prepared)
    faults.point("prepare.staged")
    try:
        started = time.perf_counter()
        tally = prepare_stream(cfg, image_dir, classes, files, out)
        # Refused by what they are (symlinks out of image_dir): listed, never read or copied.
        tally.bad.extend({"file": str(b.path.relative_to(image_dir)), "label": b.label,
                          "reason": b.reason} for b in refused)
        _check(cfg, image_dir, classes, tally)
        manifest = _manifest(cfg, image_dir, classes, tally)
        write_json(out / "manifest.json", manifest)
        faults.point("json.manifest")
        write_json(out / "quarantine.json", tally.bad)
        mean, std = tally.mean_std()
        write_json(out / "stats.json", {"mean": mean, "std": std})
        metrics = _metrics(tally, time.perf_counter() - started, len(classes), list_seconds)
        _record_and_swap(cfg, out, image_dir, metrics)
    except BaseException:  # a failure or SIGTERM: no half-written folder left, the old stays
        shutil.rmtree(out, ignore_errors=True)
        raise
    faults.point("swap.done")
    tally.cache.compact(tally.hashes)  # only once the new output is in place
    faults.point("prepare.compacted")
    write_json(Path(cfg.paths.reports) / "prepare.json", metrics)
    faults.point("prepare.reported")
    counts = manifest["split_counts"]
    log.info(f"prepare: {tally.good} images ({len(tally.bad)} quarantined) in {len(classes)} "
             f"classes -> " + ", ".join(f"{s} {counts[s]}" for s in SPLITS)
             + f"; {tally.decoded} decoded, {tally.cached} from the cache")
    return metrics


def _record_and_swap(cfg: Config, out: Path, image_dir: Path, metrics: dict) -> None:
    """The stage's MLflow run (data version, metrics, dataset, the JSON files),
    then the staged output swapped in, inside the run: it ends FINISHED only if done."""
    with tracking.sidecar_run(cfg, STAGE, out, params=_params(cfg)) as run:
        manifest_digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
        run.set_tags({"tfmlops.data_version": manifest_digest[:16]})
        run.log_metrics(metrics)
        run.log_dataset(image_dir.name or "images", str(image_dir.resolve()),
                        manifest_digest[:16], context="training")
        run.wait_open()  # its run file goes into `out` before `out` moves
        swap_in(out, cfg.paths.prepared)
        # From where they now are: the sidecar reads each file after this call returns.
        for name in ("manifest.json", "stats.json", "quarantine.json"):
            run.log_artifact(Path(cfg.paths.prepared) / name, "prepared")


def _check(cfg: Config, image_dir: Path, classes: list[str], tally) -> None:
    total = tally.good + len(tally.bad)
    fraction = len(tally.bad) / total
    if fraction > cfg.data.max_bad_fraction:
        reasons = Counter(b["reason"].split(":")[0] for b in tally.bad).most_common(3)
        raise DataError(
            f"{len(tally.bad)} of {total} files in {image_dir} are unusable ({fraction:.1%} > "
            f"data.max_bad_fraction {cfg.data.max_bad_fraction:.1%}; "
            + ", ".join(f"{n} {r}" for r, n in reasons)
            + "); fix or remove them, or raise data.max_bad_fraction"
        )
    check_empty_classes(image_dir, classes, {row[2] for row in tally.rows})
    for s in SPLITS:
        if not tally.split_counts[s]:
            raise DataError(
                f"the {s} split is empty ({tally.good} good images); add images or raise "
                f"data.split.{s if s != 'train' else 'val/test'}"
            )
    _check_class_splits(cfg, image_dir, classes, tally)


def _check_class_splits(cfg: Config, image_dir: Path, classes: list[str], tally) -> None:
    """Every class in every split, or an error/warning (data.split.too_few) naming it."""
    per_class = Counter((label, split) for _, _, label, split in tally.rows)
    short = [c for c in classes if any(per_class[(c, s)] == 0 for s in SPLITS)]
    if not short:
        return
    c = short[0]
    counts = ", ".join(f"{s} {per_class[(c, s)]}" for s in SPLITS)
    others = f" (and {len(short) - 1} more class(es))" if len(short) > 1 else ""
    message = (f"class {c!r}{others} is missing from a split ({counts}): each class needs at "
               f"least 3 readable images to reach train, val and test; add images to "
               f"{image_dir / c}")
    if cfg.data.split.too_few == "error":
        raise DataError(f"{message}, or set data.split.too_few: warn to go on")
    log.warning(f"prepare: {message}; going on (data.split.too_few: warn)")


def _params(cfg: Config) -> dict:
    return {"seed": cfg.seed, "data": cfg.to_dict()["data"], "pipeline": cfg.to_dict()["pipeline"]}


def _metrics(tally, write_seconds: float, classes: int, list_seconds: float) -> dict:
    total = tally.good + len(tally.bad)
    return {
        "images_total": total,
        "images_good": tally.good,
        "images_bad": len(tally.bad),
        "bad_fraction": len(tally.bad) / total,
        "classes": classes,
        **{f"{s}_images": tally.split_counts[s] for s in SPLITS},
        "images_decoded": tally.decoded,
        "images_cached": tally.cached,
        "files_hashed": tally.hashed,  # the others' hashes were remembered (data.hash_memo)
        "source_bytes": tally.source_bytes,
        "stored_bytes": tally.stored_bytes,
        "write_seconds": round(write_seconds, 3),
        # prepare's own profile, at no cost: where its time went (train profiles the input
        # pipeline; prepare runs no TensorFlow). decode: of write_seconds, the first pass.
        "list_seconds": round(list_seconds, 3),
        "decode_seconds": round(tally.decode_seconds, 3),
        "images_per_s": round(total / max(write_seconds, 1e-9), 1),
    }


def _manifest(cfg: Config, image_dir: Path, classes: list[str], tally) -> dict:
    rows = sorted(tally.rows)
    per_class = Counter((split, label) for _, _, label, split in rows)
    store = cfg.data.store
    return {
        "image_dir": str(image_dir),
        "classes": classes,
        "label_index": {c: i for i, c in enumerate(classes)},
        "image_size": cfg.data.image_size,
        "channels": cfg.data.channels,
        "split_counts": dict(tally.split_counts),
        "class_counts": {s: {c: per_class[(s, c)] for c in classes} for s in SPLITS},
        "source_sizes": tally.source_sizes.summary(),
        "stored": {
            "short_side": store.short_side or cfg.data.image_size,
            "encoding": store.encoding,
            "jpeg_quality": store.jpeg_quality,
            "encodings": dict(sorted(tally.encodings.items())),
            "sizes": tally.stored_sizes.summary(),
            "bytes": tally.stored_bytes,
        },
        "quarantined": len(tally.bad),
        "files": [{"file": f, "sha256": sha, "label": label, "split": split}
                  for f, sha, label, split in rows],
    }
