"""Every tf.data.Dataset the later stages use, built from prepare's TFRecords.

files -> parallel interleave -> parse/decode/resize/normalize (parallel map)
-> cache -> shuffle -> augment (training only) -> batch -> prefetch.
Normalization uses the train split's per-channel mean and std from
`stats.json`. `decode_stored` and `preprocess` are the functions the exported
serving signature runs in-graph: training, evaluation and every served path see
the same pixels.

The cache (`pipeline.cache`) keeps the decoded split after the first epoch, in
memory or in a file (`cache_folder`); `auto` picks memory when the train split fits
`pipeline.cache_budget_mb`. `cache_choice` says what was picked and why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from tfmlops.artifacts import MANIFEST, STATS, read_manifest, require
from tfmlops.config import Config
from tfmlops.data.tfrecords import shard_files
from tfmlops.errors import DataError
from tfmlops.files import MARKER, claim_folder, owned_children

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Part of the disk cache's key: bump it when `dataset`'s parse changes the cached tensors.
CACHE_FORMAT = 2  # 2: stored JPEGs decode with the accurate integer DCT
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}


@dataclass(frozen=True)
class Prepared:
    """What a later stage needs to know about the prepared data."""

    folder: Path
    classes: list[str]
    counts: dict[str, int]  # examples per split
    image_size: int
    channels: int
    mean: list[float]
    std: list[float]
    stored_size: int | None = None  # prepare's stored short side (None: full size)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, self.channels)


def load_prepared(cfg: Config) -> Prepared:
    """Read the manifest and stats; fail clearly if they are missing or stale."""
    folder = Path(cfg.paths.prepared)
    what = f"prepared data in {folder}"
    manifest = read_manifest(folder, f"{what} ({MANIFEST})")
    stats = json.loads(require(folder / STATS, "prepare", f"{what} ({STATS})").read_text())
    if manifest["image_size"] != cfg.data.image_size or manifest["channels"] != cfg.data.channels:
        raise DataError(f"{what} is stale: it has {manifest['image_size']}px x "
                        f"{manifest['channels']} channel(s), params ask for "
                        f"{cfg.data.image_size}px x {cfg.data.channels}; run `dvc repro prepare`")
    return Prepared(
        folder=folder, classes=manifest["classes"],
        counts={s: manifest["split_counts"][s] for s in ("train", "val", "test")},
        image_size=manifest["image_size"], channels=manifest["channels"],
        mean=stats["mean"], std=stats["std"],
        # prepare's stored short side: the served paths reduce a request image to it first
        stored_size=manifest.get("stored", {}).get("short_side"),
    )


def preprocess(image_uint8: tf.Tensor, image_size: int, mean, std) -> tf.Tensor:
    """uint8 [..., H, W, C] of any size -> float32 model input (resize + normalize)."""
    x = tf.image.resize(tf.cast(image_uint8, tf.float32), (image_size, image_size))
    x = x / 255.0
    return (x - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def decode_stored(encoded: tf.Tensor, channels: int) -> tf.Tensor:
    """A stored image (prepare writes JPEG or PNG) -> uint8 [H, W, channels].

    TensorFlow's default JPEG DCT is the fast one, which differs from libjpeg's
    accurate integer DCT (what Pillow and OpenCV use) by a few grey levels:
    decoding with the accurate one makes training, evaluation and serving agree.
    """
    return tf.cond(tf.io.is_jpeg(encoded),
                   lambda: tf.io.decode_jpeg(encoded, channels=channels, dct_method="INTEGER_ACCURATE"),
                   lambda: tf.io.decode_png(encoded, channels=channels))


def decode(record: tf.Tensor, channels: int) -> tuple[tf.Tensor, tf.Tensor]:
    ex = tf.io.parse_single_example(record, FEATURES)
    return decode_stored(ex["image"], channels), ex["label"]


def dataset(cfg: Config, prepared: Prepared, split: str, *, batch_size: int,
            training: bool = False, normalize: bool = True,
            cache: str | None = None) -> tf.data.Dataset:
    """A batched dataset of (image, label) for one split.

    `cache` (memory | disk | off) overrides `pipeline.cache` for this dataset,
    e.g. off for a single pass.
    """
    files = shard_files(prepared.folder, split)
    if prepared.counts[split] < 1:
        raise DataError(f"the {split} split is empty; add images or change data.split")
    p = cfg.pipeline
    size, channels = prepared.image_size, prepared.channels
    # not normalized: the resized image in [0, 1] (x - 0 and x / 1 are exact in float32)
    mean, std = (prepared.mean, prepared.std) if normalize else (0.0, 1.0)

    def parse(record):
        image, label = decode(record, channels)
        return tf.ensure_shape(preprocess(image, size, mean, std), (size, size, channels)), label

    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 4),
                       num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE)
    ds = _cached(ds, cfg, prepared, split, normalize, cache)
    if training:
        ds = ds.shuffle(p.shuffle_buffer, seed=cfg.seed, reshuffle_each_iteration=True)
        if p.augment.enabled:
            augment = augmenter(cfg)
            ds = ds.map(lambda x, y: (augment(x), y), num_parallel_calls=AUTOTUNE)
    # Serial batch: after the cache a batch is only a copy, and a parallel
    # batch's hand-off cost more than it saved (benchmarks/input_pipeline.py).
    ds = ds.batch(batch_size).prefetch(AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = p.deterministic
    # With the autotuner off, AUTOTUNE above means one parallel call per core.
    options.autotune.enabled = p.autotune
    # Explicit, not AUTO: multi-worker training shards by element, not by file
    # (a split may have fewer files than workers).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


# ------------------------------------------------------------------ caching

CACHE_KIND = "input-cache"  # the marker of paths.cache/<key> (files.claim_folder)
CACHE_KEY = r"[0-9a-f]{16}"  # cache_folder's key
_HELD: dict[str, int] = {}  # cache folder -> descriptor of its lock, held for the process's life
_LOGGED: set[tuple[str, str]] = set()


def cache_choice(cfg: Config, prepared: Prepared) -> dict:
    """What `pipeline.cache` resolves to for this data: {mode, requested, estimate_mb,
    budget_mb, folder}. The estimate is the train split's decoded float32 images."""
    p = cfg.pipeline
    estimate = prepared.counts["train"] * prepared.image_size ** 2 * prepared.channels * 4
    mode = p.cache
    if mode == "auto":
        mode = "memory" if estimate <= p.cache_budget_mb * 2 ** 20 else "disk"
    return {"mode": mode, "requested": p.cache, "estimate_mb": round(estimate / 2 ** 20, 1),
            "budget_mb": p.cache_budget_mb,
            "folder": str(cache_folder(cfg, prepared)) if mode == "disk" else None}


def cache_folder(cfg: Config, prepared: Prepared) -> Path:
    """paths.cache/<key>: the key hashes the prepared data (its manifest) and what the
    cached tensors depend on, so a file of other data or other params is never read."""
    manifest = (prepared.folder / MANIFEST).read_bytes()
    identity = json.dumps({"format": CACHE_FORMAT, "size": prepared.image_size,
                           "channels": prepared.channels, "mean": prepared.mean,
                           "std": prepared.std}, sort_keys=True).encode()
    key = hashlib.sha256(hashlib.sha256(manifest).digest() + identity).hexdigest()[:16]
    return Path(cfg.paths.cache) / key


def _cached(ds, cfg: Config, prepared: Prepared, split: str, normalize: bool, override):
    choice = cache_choice(cfg, prepared)
    mode = override or choice["mode"]
    if (str(prepared.folder), mode) not in _LOGGED:
        _LOGGED.add((str(prepared.folder), mode))
        where = f" in {choice['folder']}" if mode == "disk" and choice["folder"] else ""
        log.info("input cache: %s%s (pipeline.cache %s; train split %.1f MB decoded, "
                 "budget %d MB)", mode, where, choice["requested"], choice["estimate_mb"],
                 choice["budget_mb"])
    if mode == "memory":
        return ds.cache()
    if mode == "disk":
        folder = Path(choice["folder"] or cache_folder(cfg, prepared))
        prefix = folder / f"{split}-{'normalized' if normalize else 'raw'}"
        if _claim(folder) or prefix.with_suffix(".index").is_file():
            return ds.cache(str(prefix))
        log.warning("input cache: %s is being written by another process; this one reads "
                    "%s uncached", folder, split)
    return ds


def _claim(folder: Path) -> bool:
    """Hold `folder`'s lock for this process; False if another live process holds it.

    The first claim removes what a killed run left (tf.data's `*.lockfile` and
    unfinished data, which would otherwise fail the next run) and other data's
    stale cache folders nobody holds: only finished files (with an `.index`) are kept.
    Only this cache's own folders are touched (its marker and key-shaped name): a
    neighbour in a shared scratch folder is neither locked nor removed.
    """
    key = str(folder.resolve())
    if key in _HELD:
        return True
    claim_folder(folder, CACHE_KIND)
    fd = _try_lock(folder)
    if fd is None:
        return False
    _HELD[key] = fd
    for f in folder.iterdir():
        if f.name not in (".lock", MARKER) and \
                not (folder / f"{f.name.split('.')[0]}.index").is_file():
            log.info("input cache: removing %s, left unfinished by an earlier run", f)
            f.unlink(missing_ok=True)
    for other in owned_children(folder.parent, CACHE_KIND, CACHE_KEY):
        if other != folder and str(other.resolve()) not in _HELD:
            other_fd = _try_lock(other)
            if other_fd is not None:
                log.info("input cache: removing %s, made from other data or params", other)
                shutil.rmtree(other, ignore_errors=True)
                os.close(other_fd)
    return True


def _try_lock(folder: Path) -> int | None:
    # flock: released by the kernel when the process dies, however it dies.
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def augmenter(cfg: Config):
    """Random geometric augmentation of one normalized image (training only)."""
    a, size, seed = cfg.pipeline.augment, cfg.data.image_size, cfg.seed

    def augment(x):
        if a.flip:
            x = tf.image.random_flip_left_right(x, seed=seed)
        batch = x[tf.newaxis]
        if a.rotation or a.zoom or a.translate:
            angle = tf.random.uniform([], -a.rotation, a.rotation, seed=seed) * 2 * 3.14159265
            zoom = tf.random.uniform([], 1 - a.zoom, 1 + a.zoom, seed=seed)
            shift = tf.random.uniform([2], -a.translate, a.translate, seed=seed) * size
            cos, sin = tf.cos(angle) / zoom, tf.sin(angle) / zoom
            c = (size - 1) / 2.0
            # Projective transform mapping output -> input pixel, about the centre.
            transform = [cos, -sin, c - cos * c + sin * c - shift[0],
                         sin, cos, c - sin * c - cos * c - shift[1], 0.0, 0.0]
            batch = tf.raw_ops.ImageProjectiveTransformV3(
                images=batch, transforms=tf.cast(tf.stack(transform)[tf.newaxis], tf.float32),
                output_shape=tf.constant([size, size]), fill_value=0.0,
                interpolation="BILINEAR", fill_mode="NEAREST",
            )
        return batch[0]

    return augment


def rows_at(cfg: Config, prepared: Prepared, split: str, indices, batch_size: int = 512):
    """The images at `indices` (sorted) of a split, in file order: `arrays(...)[0][indices]`,
    read in batches, one pass, holding only the images kept (not the split)."""
    import numpy as np

    wanted = np.asarray(indices, dtype=np.int64)
    kept, start = [], 0
    if wanted.size == 0:
        return np.zeros((0, *prepared.input_shape), np.float32)
    for x, _ in dataset(cfg, prepared, split, batch_size=batch_size, cache="off"):
        n = int(x.shape[0])
        pick = wanted[(wanted >= start) & (wanted < start + n)] - start
        if pick.size:
            kept.append(x.numpy()[pick])
        start += n
        if start > wanted[-1]:
            break  # the rest of the split is never decoded
    return np.concatenate(kept)


def predictions(model, batches, batch_size: int):
    """(batch, the model's outputs as numpy) for each batch of `batches`, whose last two
    items are the model inputs and the labels: the one prediction loop over a split."""
    import numpy as np

    for batch in batches:
        # predict, not predict_on_batch: under a MirroredStrategy the latter returns
        # every replica's copy of the outputs.
        yield batch, np.asarray(model.predict(batch[-2], batch_size=batch_size, verbose=0))


def predicted(model, cfg: Config, prepared: Prepared, split: str, batch_size: int):
    """(labels, model outputs) over a split, in file order, predicted batch by batch from
    the TFRecords: memory for the outputs (N x classes), not the images."""
    import numpy as np

    ys, outs = [], []
    batches = dataset(cfg, prepared, split, batch_size=batch_size, cache="off")
    for (_, y), out in predictions(model, batches, batch_size):
        outs.append(out)
        ys.append(y.numpy())
    return np.concatenate(ys), np.concatenate(outs)


def arrays(cfg: Config, prepared: Prepared, split: str, normalize: bool = True):
    """The whole split as numpy arrays (x float32, y int64), in file order."""
    import numpy as np

    xs, ys = [], []
    for x, y in dataset(cfg, prepared, split, batch_size=512, normalize=normalize):
        xs.append(x.numpy())
        ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)
