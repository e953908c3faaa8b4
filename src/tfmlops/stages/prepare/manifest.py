"""What `prepare` makes of a streamed tally (data.stream.Tally): the checks a usable
set passes, `manifest.json` and the stage's metrics.

The manifest holds the label map, counts per class and split, source and stored
sizes, encodings and every good file with its content hash; its sha256 is the data
version (artifacts.data_version). No TensorFlow and no MLflow here.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.stages.prepare.images import SPLITS, check_empty_classes
from tfmlops.stages.prepare.stream import Tally

log = logging.getLogger(__name__)


def check_tally(cfg: Config, image_dir: Path, classes: list[str], tally: Tally) -> None:
    """DataError (one line) unless the set is usable: few enough bad files, no empty
    class or split, every class in every split (or a warning: data.split.too_few)."""
    total = tally.good + len(tally.bad)
    fraction = len(tally.bad) / total
    if fraction > cfg.data.max_bad_fraction:
        reasons = Counter(b["reason"].split(":")[0] for b in tally.bad).most_common(3)
        raise DataError(f"{len(tally.bad)} of {total} files in {image_dir} are unusable "
                        f"({fraction:.1%} > data.max_bad_fraction {cfg.data.max_bad_fraction:.1%}; "
                        f"{', '.join(f'{n} {r}' for r, n in reasons)}); fix or remove them, or "
                        "raise data.max_bad_fraction")
    check_empty_classes(image_dir, classes, {label for label, _ in +tally.per_class})
    for s in SPLITS:
        if not tally.split_counts[s]:
            raise DataError(f"the {s} split is empty ({tally.good} good images); add images or "
                            f"raise data.split.{s if s != 'train' else 'val/test'}")
    per_class = tally.per_class
    short = [c for c in classes if any(per_class[(c, s)] == 0 for s in SPLITS)]
    if not short:
        return
    c = short[0]
    counts = ", ".join(f"{s} {per_class[(c, s)]}" for s in SPLITS)
    others = f" (and {len(short) - 1} more class(es))" if len(short) > 1 else ""
    message = (f"class {c!r}{others} is missing from a split ({counts}): each class needs at "
               f"least 3 readable images to reach train, val and test; add images to "
               f"{image_dir}/{c}")
    if cfg.data.split.too_few == "error":
        raise DataError(f"{message}, or set data.split.too_few: warn to go on")
    log.warning(f"prepare: {message}; going on (data.split.too_few: warn)")


def prepare_params(cfg: Config) -> dict:
    """The part of the config prepare's run records as params."""
    return {"seed": cfg.seed, "data": cfg.to_dict()["data"], "pipeline": cfg.to_dict()["pipeline"]}


def prepare_metrics(tally: Tally, write_seconds: float, classes: int,
                    list_seconds: float) -> dict:
    """reports/prepare.json: counts, bytes and where the time went."""
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


def build_manifest(cfg: Config, image_dir: Path, classes: list[str], tally: Tally) -> dict:
    """manifest.json: the label map, counts, sizes, encodings and every good file, the
    files an iterator (`files.write_json_streamed` writes them as they come): sorted
    here from the local engine's list, merged from Beam's sorted parts (beam_fold)."""
    rows = tally.rows if isinstance(tally.rows, SortedRows) else sorted(tally.rows)
    per_class = tally.per_class
    store = cfg.data.store
    return {
        "image_dir": str(image_dir),
        "classes": classes,
        "label_index": {c: i for i, c in enumerate(classes)},
        "image_size": cfg.data.image_size,
        "channels": cfg.data.channels,
        "split_counts": dict(tally.split_counts),
        "class_counts": {s: {c: per_class[(c, s)] for c in classes} for s in SPLITS},
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
        # with the source facts a slice of the evaluation needs
        "files": ({"file": f, "sha256": sha, "label": label, "split": split, "format": fmt,
                   "width": width, "height": height, "bytes": size}
                  for f, sha, label, split, fmt, width, height, size in rows),
    }


class SortedRows:
    """Rows already in the manifest's order, read as they are iterated (Beam's parts)."""

    def __init__(self, read):
        self._read = read  # () -> an iterator of row tuples, sorted

    def __iter__(self):
        return iter(self._read())
