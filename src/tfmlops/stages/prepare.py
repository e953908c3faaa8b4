"""Stage `prepare`: validate images, split them, write TFRecords and statistics.

Output (`paths.prepared`, built in a staging folder and swapped in whole):
TFRecord shards per split, `manifest.json` (label map, counts per class and
split, image sizes, content hashes), `stats.json` (per-channel mean and std
of the train split), `quarantine.json` and a copy of every rejected file.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections import Counter
from pathlib import Path

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.data.images import SPLITS, assign_split, scan
from tfmlops.errors import DataError
from tfmlops.files import staging_dir, swap_in, write_json
from tfmlops.progress import Progress

STAGE = "prepare"


def run(cfg: Config) -> dict[str, float]:
    tracking.preflight(cfg)  # a dead server fails in seconds, before the scan
    image_dir = Path(cfg.data.image_dir)
    classes, good, bad = _validated(cfg, image_dir)
    total = len(good) + len(bad)
    splits = {s: [] for s in SPLITS}
    for img in good:
        splits[assign_split(img.sha256, cfg.seed, cfg.data.split.val, cfg.data.split.test)].append(img)
    for s in SPLITS:
        if not splits[s]:
            raise DataError(
                f"the {s} split is empty ({len(good)} good images); add images or raise "
                f"data.split.{s if s != 'train' else 'val/test'}"
            )

    out = staging_dir(cfg.paths.prepared)
    with tracking.stage_run(cfg, STAGE, out, params=_params(cfg)) as run:
        import tensorflow as tf  # after the run opened: a dead server fails before this cost

        from tfmlops.data import pipeline
        from tfmlops.data.tfrecords import write_split

        label_index = {c: i for i, c in enumerate(classes)}
        started = time.perf_counter()
        for s in SPLITS:
            write_split(out, s, splits[s], label_index, cfg.data.shards)
        manifest = _manifest(cfg, image_dir, classes, splits, bad)
        write_json(out / "manifest.json", manifest)
        write_json(out / "quarantine.json", _quarantine(out, image_dir, bad))

        # Statistics of the train split at the model's input size, through the
        # same decode/resize path training uses.
        raw = pipeline.Prepared(out, classes, manifest["split_counts"], cfg.data.image_size,
                                cfg.data.channels, [0.0] * cfg.data.channels,
                                [1.0] * cfg.data.channels)
        mean, std = _channel_stats(tf, pipeline.dataset(cfg, raw, "train", batch_size=256,
                                                        normalize=False))
        write_json(out / "stats.json", {"mean": mean, "std": std})
        write_seconds = time.perf_counter() - started

        prepared = pipeline.Prepared(out, classes, manifest["split_counts"], cfg.data.image_size,
                                     cfg.data.channels, mean, std)
        rate = _profile_pipeline(cfg, pipeline, prepared, run)

        metrics = {
            "images_total": total,
            "images_good": len(good),
            "images_bad": len(bad),
            "bad_fraction": len(bad) / total,
            "classes": len(classes),
            **{f"{s}_images": len(splits[s]) for s in SPLITS},
            "write_seconds": round(write_seconds, 3),
            "pipeline_images_per_s": round(rate, 1),
        }
        manifest_digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
        run.set_tags({"tfmlops.data_version": manifest_digest[:16]})
        run.log_metrics(metrics)
        run.log_dataset(image_dir.name or "images", str(image_dir.resolve()),
                        manifest_digest[:16], context="training")
        for name in ("manifest.json", "stats.json", "quarantine.json"):
            run.log_artifact(out / name, "prepared")
        swap_in(out, cfg.paths.prepared)
    write_json(Path(cfg.paths.reports) / "prepare.json", metrics)
    print(f"prepare: {len(good)} images ({len(bad)} quarantined) in {len(classes)} classes -> "
          + ", ".join(f"{s} {len(splits[s])}" for s in SPLITS))
    return metrics


def _validated(cfg: Config, image_dir: Path):
    progress = Progress(None, "prepare: validating images", every=500)
    classes, good, bad = scan(image_dir, cfg.data.channels, on_file=progress.update)
    progress.close()
    total = len(good) + len(bad)
    fraction = len(bad) / total
    if fraction > cfg.data.max_bad_fraction:
        reasons = Counter(b.reason.split(":")[0] for b in bad).most_common(3)
        raise DataError(
            f"{len(bad)} of {total} files in {image_dir} are unusable ({fraction:.1%} > "
            f"data.max_bad_fraction {cfg.data.max_bad_fraction:.1%}; "
            + ", ".join(f"{n} {r}" for r, n in reasons)
            + "); fix or remove them, or raise data.max_bad_fraction"
        )
    return classes, good, bad


def _params(cfg: Config) -> dict:
    return {"seed": cfg.seed, "data": cfg.to_dict()["data"], "pipeline": cfg.to_dict()["pipeline"]}


def _manifest(cfg, image_dir: Path, classes, splits, bad) -> dict:
    per_class = {s: dict(Counter(img.label for img in splits[s])) for s in SPLITS}
    good = [img for s in SPLITS for img in splits[s]]
    widths = [g.width for g in good]
    heights = [g.height for g in good]
    return {
        "image_dir": str(image_dir),
        "classes": classes,
        "label_index": {c: i for i, c in enumerate(classes)},
        "image_size": cfg.data.image_size,
        "channels": cfg.data.channels,
        "split_counts": {s: len(splits[s]) for s in SPLITS},
        "class_counts": {s: {c: per_class[s].get(c, 0) for c in classes} for s in SPLITS},
        "source_sizes": {
            "width": {"min": min(widths), "max": max(widths), "mean": sum(widths) / len(widths)},
            "height": {"min": min(heights), "max": max(heights), "mean": sum(heights) / len(heights)},
        },
        "quarantined": len(bad),
        "files": sorted(
            ({"file": str(img.path.relative_to(image_dir)), "sha256": img.sha256,
              "label": img.label, "split": s} for s in SPLITS for img in splits[s]),
            key=lambda f: f["file"],
        ),
    }


def _quarantine(out: Path, image_dir: Path, bad) -> list[dict]:
    """Copy each rejected file beside the report (the user's folder stays untouched)."""
    folder = out / "quarantine"
    listed = []
    for b in bad:
        rel = b.path.relative_to(image_dir)
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(b.path, folder / rel)
        listed.append({"file": str(rel), "label": b.label, "reason": b.reason})
    return listed


def _channel_stats(tf, ds) -> tuple[list[float], list[float]]:
    total = count = squares = None
    for x, _ in ds:
        s = tf.reduce_sum(tf.cast(x, tf.float64), axis=(0, 1, 2))
        q = tf.reduce_sum(tf.square(tf.cast(x, tf.float64)), axis=(0, 1, 2))
        n = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float64)
        total = s if total is None else total + s
        squares = q if squares is None else squares + q
        count = n if count is None else count + n
    mean = total / count
    std = tf.sqrt(tf.maximum(squares / count - tf.square(mean), 1e-12))
    return [float(v) for v in mean.numpy()], [max(float(v), 1e-3) for v in std.numpy()]


def _profile_pipeline(cfg: Config, pipeline, prepared, run) -> float:
    """Steady-state images/s of the training pipeline, with a profiler trace of it."""
    from tfmlops import profiling

    ds = pipeline.dataset(cfg, prepared, "train", batch_size=cfg.train.batch_size, training=True)
    for _ in ds:  # first epoch fills the cache
        pass
    with profiling.trace(cfg, STAGE) as folder:
        started = time.perf_counter()
        n = 0
        for x, _ in ds:
            n += int(x.shape[0])
        elapsed = time.perf_counter() - started
    if folder is not None:
        run.log_artifact(folder, "profile")
    return n / max(elapsed, 1e-9)

