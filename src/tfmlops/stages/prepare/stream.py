"""prepare's streaming core: files in, TFRecord shards and a small tally out.

Two passes over the file list, each in a fixed order. The first (`_decode_pass`)
has a process pool read, hash and (unless the cache holds that content) decode
every file that `data.hash_memo` does not remember unchanged with a cached content;
only each file's hash and whether it is usable are kept. The split is stratified
among the usable files of each class (`images.assign_splits`), which is why it
waits for the first pass. The second takes each usable file's result from the
cache and writes it to its split's shards in content-hash order (`write_order`),
keeping only counts, sums and one small row per file: memory does not grow with
image size, and what is written depends neither on the worker count nor on the
listing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import shutil
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from tfmlops import faults
from tfmlops.config import Config
from tfmlops.data.store import (
    CacheLock,
    ImageCache,
    Stored,
    StoreSpec,
    cached_prefixes,
    hash_and_store,
    hash_and_store_chunk,
    setup_worker,
    store_known,
)
from tfmlops.data.tfrecords import ShardedWriter, encode_example
from tfmlops.errors import DataError
from tfmlops.progress import Progress
from tfmlops.stages.prepare.data_profile import Profile
from tfmlops.stages.prepare.hash_memo import HashMemo, StatKey, stat_key, trust_cutoff
from tfmlops.stages.prepare.images import SPLITS, assign_splits, staged_path, unsupported
from tfmlops.stages.prepare.machine import cores, fit_to_machine, most_workers

log = logging.getLogger(__name__)
# With data.workers 0 (auto), a pool starts only for work worth its start-up (about a
# second): small images (the digits) decode faster in this process.
POOL_MIN_BYTES = 8 * 2**20
POOL_MIN_JOBS = 8  # per worker
HASH_MEMO = "hashes.sqlite"  # in paths.prepare_cache, beside the spec folders


@dataclass
class Extent:
    """Min, max and mean of (width, height) pairs, kept as running values."""

    n: int = 0
    lo: tuple = (float("inf"),) * 2  # read only once an image is added (check_tally)
    hi: tuple = (0, 0)
    total: tuple = (0, 0)

    def add(self, size) -> None:
        self.merge(Extent(1, tuple(size), tuple(size), tuple(size)))

    def merge(self, other: Extent) -> None:
        """Fold `other` in: integer sums, min and max, so the order never shows."""
        self.n += other.n
        self.lo, self.hi = tuple(map(min, self.lo, other.lo)), tuple(map(max, self.hi, other.hi))
        self.total = tuple(a + b for a, b in zip(self.total, other.total, strict=True))

    def summary(self) -> dict:
        return {name: {"min": self.lo[i], "max": self.hi[i], "mean": self.total[i] / max(self.n, 1)}
                for i, name in enumerate(("width", "height"))}


@dataclass
class Tally:
    cache: ImageCache | None  # None: the Beam engine, always cold
    profile: Profile | None = None  # data.contract.profile: folded in as images are written
    # (file, sha256, label, split, source format, width, height, bytes) of good files; the
    # Beam engine keeps none in the driver: its workers write them in parts (beam_fold)
    rows: list = field(default_factory=list)
    bad: list = field(default_factory=list)  # {"file", "label", "reason"} (Beam: streamed)
    per_class: Counter = field(default_factory=Counter)  # (label, split) -> good images
    leakage: dict | None = None  # Beam: data_profile.json's leakage, found by a worker
    # Beam: its run's staging prefix (beam_staging.RunPrefix), whose parts are read until
    # the manifest is written (beam.remove_parts)
    parts: object | None = None
    hashes: set = field(default_factory=set)
    split_counts: Counter = field(default_factory=lambda: Counter({s: 0 for s in SPLITS}))
    encodings: Counter = field(default_factory=Counter)
    source_sizes: Extent = field(default_factory=Extent)
    stored_sizes: Extent = field(default_factory=Extent)
    decoded: int = 0
    cached: int = 0
    hashed: int = 0
    decode_seconds: float = 0.0  # the first pass: stat, hash, decode what the cache lacks
    source_bytes: int = 0
    stored_bytes: int = 0
    # per channel, over the train split: exact sums (exact_sum), so that any order of
    # adding (a pool's, a Beam combiner's) gives the same bytes
    sums: list | None = None
    squares: list | None = None
    pixels: int = 0

    @property
    def good(self) -> int:
        return sum(self.split_counts.values())

    def add_train_stats(self, stored: Stored) -> None:
        self._add_sums([exact_sum(v) for v in stored.sums],
                       [exact_sum(v) for v in stored.squares], stored.pixels)

    def _add_sums(self, sums: list[int], squares: list[int], pixels: int) -> None:
        self.sums = [a + b for a, b in zip(self.sums or [0] * len(sums), sums, strict=True)]
        self.squares = [a + b for a, b in zip(self.squares or [0] * len(squares), squares,
                                               strict=True)]
        self.pixels += pixels

    def merge(self, other: Tally) -> Tally:
        """Fold `other`'s counts and sums in (Beam's combiners): exact, so in any order
        the local engine's. Rows and refusals are not merged: they are streamed."""
        self.split_counts.update(other.split_counts)
        self.per_class.update(other.per_class)
        self.encodings.update(other.encodings)
        self.source_sizes.merge(other.source_sizes)
        self.stored_sizes.merge(other.stored_sizes)
        for name in ("decoded", "hashed", "source_bytes", "stored_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.sums is not None:
            self._add_sums(other.sums, other.squares, other.pixels)
        if self.profile is not None:
            self.profile.merge(other.profile)
        return self

    def mean_std(self) -> tuple[list[float], list[float]]:
        mean = [as_float(s) / self.pixels for s in self.sums]
        var = [max(as_float(q) / self.pixels - m * m, 1e-12)
               for q, m in zip(self.squares, mean, strict=True)]
        return mean, [max(v**0.5, 1e-3) for v in var]


EXACT_SCALE = 1074  # 2**-1074 is the smallest float: every float is an integer multiple


def exact_sum(value: float) -> int:
    """`value` as an integer count of 2**-1074: sums of these are exact, so they do not
    depend on the order of adding (float sums do, in their last bits)."""
    mantissa, exponent = math.frexp(value)
    whole, shift = int(mantissa * (1 << 53)), exponent - 53 + EXACT_SCALE
    return whole << shift if shift >= 0 else whole >> -shift


def as_float(total: int) -> float:
    """An `exact_sum` total as the float nearest to it."""
    return float(Fraction(total, 1 << EXACT_SCALE))


def store_spec(cfg: Config) -> StoreSpec:
    d = cfg.data
    return StoreSpec(d.channels, d.store.short_side or d.image_size, d.store.encoding,
                     d.store.jpeg_quality, d.image_size)


def new_tally(cfg: Config, cache: ImageCache | None) -> Tally:
    """An empty tally for either engine, with a profile when data.contract.profile."""
    contract = cfg.data.contract
    return Tally(cache, Profile(contract.tiny.side) if contract.profile else None)


def pool_size(cfg: Config, miss_bytes: list[int]) -> int:
    """Processes for decoding files of `miss_bytes` sizes (1: this process); data.workers
    is cut to what this machine's cores take (config.machine.fit_to_machine)."""
    if cfg.data.workers:
        return max(1, min(cfg.data.workers, most_workers(), len(miss_bytes)))
    if sum(miss_bytes) < POOL_MIN_BYTES:
        return 1
    return min(cores(), max(1, len(miss_bytes) // POOL_MIN_JOBS))


def prepare_stream(cfg: Config, image_dir: Path, classes: list[str], files, out: Path) -> Tally:
    """Write every good image of `files` [(path, class)] to `out`'s shards; copy bad
    ones to `out/quarantine`; return the tally."""
    spec = store_spec(cfg)
    _, open_max = fit_to_machine(cfg.data.shards, cfg.data.workers)  # one line if cut
    lock = CacheLock(cfg.paths.prepare_cache).shared()  # the cache may be another checkout's too
    try:
        return _prepare_locked(cfg, image_dir, classes, files, out, spec, open_max, lock)
    finally:
        lock.close()


def _prepare_locked(cfg: Config, image_dir: Path, classes: list[str], files, out: Path,
                    spec: StoreSpec, open_max: int, lock: CacheLock) -> Tally:
    tally = new_tally(cfg, ImageCache(cfg.paths.prepare_cache, spec))
    memo = HashMemo(Path(cfg.paths.prepare_cache) / HASH_MEMO)
    started = time.perf_counter()
    try:
        cutoff = trust_cutoff()  # before any file is read
        # a few numbers per file, not a stat result (memory per file)
        stats = [None if unsupported(path) else _stat(path) for path, _ in files]
        faults.point("decode.stat")
        known = [st and memo.get(path, st) for (path, _), st in zip(files, stats, strict=True)]
        keys, reasons = _decode_pass(files, stats, known, tally, spec, cfg)
        faults.point("decode.done")
        if lock.exclusive():  # no other run reads the memo while it is rewritten
            memo.replace(((path, st, sha)
                          for (path, _), st, sha in zip(files, stats, keys, strict=True) if sha),
                         cutoff)
        else:  # kept as it is: a file it misses is only hashed again next time
            log.info("prepare: another prepare is using %s; the hash memo is not updated",
                     cfg.paths.prepare_cache)
        lock.shared()
    finally:
        memo.close()
        tally.cache.close()  # what was decoded stays cached, even if this run fails
    tally.decode_seconds = time.perf_counter() - started
    good = [(sha, label) for (_, label), sha, reason in zip(files, keys, reasons, strict=True)
            if reason is None]
    _warn_across_classes(good, keys, lambda i: str(files[i][0].relative_to(image_dir)))
    splits = assign_splits(good, cfg.seed, cfg.data.split.val, cfg.data.split.test)
    label_index = {c: i for i, c in enumerate(classes)}
    writers = {s: ShardedWriter(out, s, cfg.data.shards, open_max) for s in SPLITS}
    progress = Progress(len(files), "prepare: writing")
    try:
        for i in write_order(keys, reasons):
            (path, label), sha, reason = files[i], keys[i], reasons[i]
            rel = str(path.relative_to(image_dir))
            if reason:
                quarantine(out, rel, path)
                faults.point("write.quarantine")
                tally.bad.append({"file": rel, "label": label, "reason": reason})
            else:
                stored = tally.cache.get(sha)
                if stored is None:  # its entry is damaged (read here, not twice): decode again
                    stored = store_known(str(path), spec, sha)
                    if not stored.ok:
                        raise DataError(f"{path} changed while prepare was reading it; run "
                                        "prepare again once nothing writes to data.image_dir")
                    tally.cache.put(sha, stored)
                    tally.decoded += 1
                split = splits[sha]
                writers[split].write(record_of(stored, label_index[label], sha),
                                     shard_of(sha, cfg.data.shards))
                faults.point("write.first")
                fold(tally, rel, sha, label, split, stored, len(stored.data))
            progress.update()
    finally:
        for w in writers.values():
            w.close()
        tally.cache.close()
    faults.point("write.closed")
    progress.close()
    return tally


def _warn_across_classes(good, keys, name) -> None:
    """One warning line when identical bytes sit in two class folders (`name(i)`: the
    i-th file's path in the image folder). They are kept, each under its own folder's
    label, in one split (`images.assign_splits`): a contradiction the user should see,
    not a reason to refuse the folder."""
    first: dict[str, str] = {}  # hash -> its first label (the strings are shared, not copied)
    shared = sorted({sha for sha, label in good if first.setdefault(sha, label) != label})
    if shared:
        warn_across_classes(len(shared), sorted(name(i) for i, sha in enumerate(keys)
                                                if sha == shared[0]))


def warn_across_classes(shared: int, example: list[str]) -> None:
    """The warning of `_warn_across_classes`: `shared` contents in several class folders,
    `example` the sorted files of the first (by hash)."""
    log.warning(f"prepare: {shared} image(s) sit in more than one class folder, each copy "
                f"kept under its folder's label (e.g. {' and '.join(example[:2])}); remove the "
                "wrong copies if one photo should have one label")


def write_order(keys: list, reasons: list) -> list[int]:
    """Indices of the files in the order their records are written: usable files by
    content hash, then the refused ones in listing order.

    The listing is class by class. Written in that order, a split's records come in
    runs of one class, and `tf.data`'s shuffle buffer, smaller than the split on big
    datasets, would hand training batches of one or two classes (16x the synthetic
    set: test accuracy 0.74 instead of 1.0). Content hashes are uniform and do not
    depend on the label, the worker count or the listing.
    """
    usable = sorted((i for i, r in enumerate(reasons) if r is None), key=lambda i: keys[i])
    return usable + [i for i, r in enumerate(reasons) if r is not None]


def shard_of(sha256: str, shards: int) -> int:
    """A record's shard: a function of its content hash alone, so every engine, worker
    count and listing puts it in the same file (within a shard, records go in
    `write_order`)."""
    return int(sha256[:8], 16) % shards


def record_of(stored: Stored, label_index: int, sha256: str) -> bytes:
    """One image's tf.train.Example: its stored bytes, label index and content hash."""
    return encode_example({"image": stored.data, "label": label_index, "sha256": sha256.encode()})


def fold(tally: Tally, rel: str, sha: str, label: str, split: str, stored: Stored,
         stored_bytes: int, keep_row: bool = True) -> None:
    """Count one written image (its facts, `stored_bytes` its stored size) into the tally;
    its manifest row too, unless `keep_row` is False (Beam's workers write rows in parts)."""
    tally.split_counts[split] += 1
    tally.per_class[(label, split)] += 1
    if tally.profile is not None:
        tally.profile.add(stored, label, split)
    tally.encodings[stored.encoding] += 1
    tally.source_sizes.add(stored.source_size)
    tally.stored_sizes.add(stored.stored_size)
    tally.stored_bytes += stored_bytes
    if split == "train":
        tally.add_train_stats(stored)
    if keep_row:
        tally.rows.append(manifest_row(rel, sha, label, split, stored))


def manifest_row(rel: str, sha: str, label: str, split: str, stored: Stored) -> tuple:
    """A good file's row: (file, sha256, label, split, source format, width, height, bytes)."""
    return (rel, sha, label, split, stored.source_format, *stored.source_size,
            stored.source_bytes)


def _stat(path: Path) -> StatKey | None:
    """The file's stat key; None if it is gone (or out of reach) since it was listed."""
    try:
        return stat_key(path.stat())
    except OSError:
        return None


def _unreadable(path: Path) -> str:
    try:
        path.stat()
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return "unreadable: it changed while prepare listed it"


def _decode_pass(files, stats, known, tally: Tally, spec: StoreSpec, cfg: Config):
    """Every file's content hash and refusal reason (None: usable); what is decoded now
    goes to the cache, good or bad.

    Which way each file goes (cache or pool) is decided once, before any result comes
    in; entries this pass adds change nothing of that plan (a duplicate's copy decoded
    now is still read). Every pool result names its file: one joined to another file
    stops the run instead of shifting the others onto the wrong hashes and labels. A
    held entry's bytes are read once, when its record is written (`prepare_stream`),
    and a damaged one is decoded again there, so the split sees what a cold run sees."""
    keys, reasons = [], []
    progress = Progress(len(files), "prepare: decoding")
    cache = tally.cache
    from_cache = [bool(sha and cache.has(sha)) for sha in known]  # known: None without a stat
    todo = [(str(path), st[0]) for (path, _), st, hit in zip(files, stats, from_cache, strict=True)
            if st and not hit]
    workers = pool_size(cfg, [size for _, size in todo])
    log.info(f"prepare: {len(files)} files, {len(todo)} to read with {workers} process(es), "
             f"{len(files) - len(todo)} known unchanged")
    with decode_pool(workers, cached_prefixes(cache.index)) as pool:
        worked = _decode_all([p for p, _ in todo], spec, pool)
        for (path, _), st, sha, hit in zip(files, stats, known, from_cache, strict=True):
            stored = None
            if st is None:
                stored = Stored(reason=unsupported(path) or _unreadable(path))
            elif not hit:
                got = next(worked, None)
                if got is None or got[0] != str(path):
                    raise DataError(f"prepare: the decode result for {got and got[0]} came back "
                                    f"for {path}; nothing was written (a bug: please report it)")
                _, sha, stored = got
                tally.hashed += sha is not None
                if stored is None and not cache.has(sha):  # 8 bytes alike, not the hash
                    stored = store_known(str(path), spec, sha)
            if sha is not None:
                tally.hashes.add(sha)
                tally.source_bytes += st[0]
            if stored is None:  # its facts are in the index; its bytes are read when written
                tally.cached += 1
                stored = Stored(reason=cache.reason(sha))
            elif sha is not None:  # decoded now
                tally.decoded += 1
                cache.put(sha, stored)
            keys.append(sha)
            reasons.append(stored.reason)
            if len(keys) == 1:
                faults.point("decode.first")
            progress.update()
        if next(worked, None) is not None:
            raise DataError("prepare: the decode pool returned more results than files were "
                            "sent; nothing was written (a bug: please report it)")
    progress.close()
    return keys, reasons


@dataclass
class Decoder:
    workers: int
    executor: object | None  # a ProcessPoolExecutor; None: decode in this process
    cached: object  # store.cached_prefixes of the cache


@contextlib.contextmanager
def decode_pool(workers: int, cached):
    """A process pool of `workers` (1: decode in this process), each worker given the
    cached hashes' prefixes once. spawn, not fork: the parent may hold threads (MLflow,
    TensorFlow in tests). The workers' entry points live in data.store, which imports
    neither the config (costly in every spawned worker: BENCHMARKS.md, figures behind
    the code) nor this module."""
    if workers <= 1:
        yield Decoder(1, None, cached)
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=setup_worker, initargs=(cached, os.getpid())) as pool:
        yield Decoder(workers, pool, cached)


def _decode_all(paths: list[str], spec: StoreSpec, pool: Decoder, chunk: int = 8):
    """hash_and_store over `paths`, results in order. With a pool, a bounded window of
    chunks is in flight (memory stays flat however many files there are); a worker
    that dies (killed, out of memory) fails the run instead of hanging it."""
    if pool.executor is None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            yield from (hash_and_store(p, spec, pool.cached) for p in paths)
        return
    window: deque = deque()
    for i in range(0, len(paths), chunk):
        window.append(pool.executor.submit(hash_and_store_chunk, paths[i : i + chunk], spec))
        if len(window) >= 4 * pool.workers:
            yield from window.popleft().result()
    while window:
        yield from window.popleft().result()


def quarantine(out: Path, rel: str, source: Path | bytes) -> None:
    """Copy a rejected file (`rel` in the image folder; the file, or the bytes read from
    a URL) beside the report (the user's folder stays untouched)."""
    target = staged_path(out / "quarantine", rel)  # inside it, however `rel` reads
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        target.write_bytes(source)
        return
    try:
        shutil.copy2(source, target)
    except OSError:  # unreadable (no permission, gone since listing): listed only, as a URL's
        target.unlink(missing_ok=True)
