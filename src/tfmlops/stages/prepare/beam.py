"""prepare on Apache Beam (`data.engine: beam`): the engine of TFX's ExampleGen and
of Dataflow, Flink and Spark, for folders one machine's pool is too slow for.

Beam's workers call the local path's own functions on each file and shard (`store`,
`stream.quarantine`, `images.assign_splits`, `stream.shard_of`, `tfrecords`); what
Beam adds is where they run and how results meet:

    files -> decode (per file) -> owner class of each content (min class index)
          -> split per class (GroupByKey class) -> join back by content hash
          -> (split, shard) groups, sorted by (hash, label) -> one shard file each
          -> one small row per file (no pixels) -> the driver

The driver (this process) folds the rows into the same `Tally` the local path
builds, so the output is the local path's byte for byte (test_beam.py): every piece
of it is defined without an order (a shard is a function of the content hash,
records sorted within it, statistics exact sums).

Always cold: no `prepare_cache`, no hash memo (docs/scaling.md, "Millions of images").
Workers write the shard parts and quarantine copies into the staging folder, so
they must share its filesystem (true of the in-process runner and of a worker
pool on this machine).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import shutil
import time
from dataclasses import replace
from pathlib import Path

from tfmlops.artifacts import run_dir
from tfmlops.errors import ConfigError, DataError, UserError
from tfmlops.logs import children_stderr_to
from tfmlops.stages.prepare.images import list_keys

log = logging.getLogger(__name__)

RUNNERS = ("DirectRunner", "PortableRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
WORKERS_LOG = "beam_workers.log"  # in reports/prepare/: what Beam's worker processes print
PARTS = ".beam"  # in the staging folder: shard parts and rows, gone before the swap


def pipeline_options(cfg):
    """`data.beam.options` as Beam's PipelineOptions, the runner checked now: an unknown
    runner or option fails in one line before any image is read."""
    _import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    flags = list(cfg.data.beam.options)
    if not any(f.startswith("--default_sdk_harness_log_level") for f in flags):
        flags.append("--default_sdk_harness_log_level=WARNING")  # each worker logs its life
    runner = None
    try:
        options = PipelineOptions(flags)
        unknown = options.get_all_options(retain_unknown_options=True).keys() - \
            options.get_all_options().keys()
        runner = options.view_as(StandardOptions).runner or "DirectRunner"
        create_runner(runner)
    except (ValueError, TypeError, ImportError, SystemExit) as exc:
        why = (f"Beam has no runner {runner!r}; name one of {', '.join(RUNNERS)}"
               if "Unexpected pipeline runner" in str(exc) else _first(exc))
        raise ConfigError(f"data.beam.options {flags}: {why}") from None
    if unknown:
        raise ConfigError(f"data.beam.options: Beam knows no option {sorted(unknown)}; fix or "
                          "remove it (e.g. --runner=DirectRunner --direct_num_workers=2)")
    return options


def is_url(image_dir: str | Path) -> bool:
    """Whether `data.image_dir` names a folder of a filesystem Beam reads (gs://, s3://)."""
    return "://" in str(image_dir)


def list_url(cfg, url: str) -> tuple[list[str], list[tuple[str, str]], list]:
    """`images.list_files` for a folder URL, through Beam's filesystems (endpoints in
    `data.beam.options`, credentials in the environment): classes, (file URL, class) in
    the order the local listing has (by path components), nothing refused by what it is
    (no symlinks); a key that cannot be a file name here fails the run naming it
    (`images.list_keys`)."""
    if cfg.data.engine != "beam":
        raise DataError(f"data.image_dir {url} is a URL: only data.engine: beam reads URLs; "
                        "set it, or copy the images to a local folder")
    options = pipeline_options(cfg)  # first: it imports Beam without its import-time warning
    from apache_beam.io.filesystems import FileSystems

    FileSystems.set_options(options)
    root = url.rstrip("/")
    try:
        found = FileSystems.match([root + "/**"])[0].metadata_list
    except Exception as exc:  # noqa: BLE001 - the store's own error, in one line
        raise DataError(f"data.image_dir {url} cannot be listed ({_first(exc)}); check the "
                        "URL and the credentials in the environment (AWS_ACCESS_KEY_ID ... or "
                        "AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS)") from None
    # every key checked as a name under the staging folder (images.list_keys)
    classes, files = list_keys(url, [m.path for m in found])
    if len(classes) < 2:
        raise DataError(f"image folder {url} has {len(classes)} class folder(s) with files; it "
                        "needs at least 2 (one sub-folder per class)")
    return classes, files, []


def prepare_beam(cfg, image_dir: Path | str, classes: list[str], files, out: Path):
    """`stream.prepare_stream` on Apache Beam: the same shards, quarantine and tally."""
    from tfmlops.data.tfrecords import place_shards
    from tfmlops.stages.prepare.images import SPLITS
    from tfmlops.stages.prepare.stream import finish_beam_tally, new_tally

    started = time.perf_counter()
    options = pipeline_options(cfg)
    parts = out / PARTS
    parts.mkdir(parents=True)
    log.info("prepare: %d files on Apache Beam (%s), no cache: every file is decoded",
             len(files), " ".join(cfg.data.beam.options))
    workers_log = run_dir(cfg, "prepare") / WORKERS_LOG
    workers_log.parent.mkdir(parents=True, exist_ok=True)
    workers_log.write_bytes(b"")
    try:
        with children_stderr_to(workers_log):
            _run(cfg, options, image_dir, classes, files, out, parts)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a worker died, the runner gave up: one line
        raise DataError(f"prepare on Apache Beam failed ({_first(exc)}); nothing was swapped "
                        f"in; its workers' log is {workers_log}; run it again, or set "
                        "data.engine: local") from None
    rows = []
    for part in sorted(parts.glob("*.rows")):
        rows.extend(pickle.loads(part.read_bytes()))
    if sorted(r["i"] for r in rows) != list(range(len(files))):
        raise DataError(f"prepare on Apache Beam returned {len(rows)} results for {len(files)} "
                        "files; nothing was swapped in (a bug: please report it)")
    for split in SPLITS:  # the parts under the local writer's names
        place_shards(out, split, {int(p.stem.rsplit("-", 1)[1]): p
                                  for p in parts.glob(f"{split}-*.part")})
    shutil.rmtree(parts)
    tally = new_tally(cfg, None)
    finish_beam_tally(tally, rows)
    tally.decode_seconds = time.perf_counter() - started
    return tally


def _run(cfg, options, image_dir: Path, classes, files, out: Path, parts: Path) -> None:
    import apache_beam as beam

    from tfmlops.stages.prepare.stream import store_spec

    spec, d = store_spec(cfg), cfg.data
    index = {c: i for i, c in enumerate(classes)}
    items = [(i, str(path), label) for i, (path, label) in enumerate(files)]
    with beam.Pipeline(options=options) as p:
        done = (p | "files" >> beam.Create(items) | "spread" >> beam.Reshuffle()
                | "decode" >> beam.Map(_decode, spec, str(image_dir), str(out)))
        good = done | "good" >> beam.Filter(lambda r: r["reason"] is None)
        splits = (good | "owner" >> beam.Map(lambda r: (r["sha"], index[r["label"]]))
                  | "first class" >> beam.CombinePerKey(min)  # the listing's first (images.py)
                  | "by class" >> beam.Map(lambda kv: (kv[1], kv[0]))
                  | "class" >> beam.GroupByKey()
                  | "split" >> beam.FlatMap(_split_class, classes, cfg.seed, d.split.val,
                                            d.split.test))
        _ = ({"file": good | "by hash" >> beam.Map(lambda r: (r["sha"], r)), "split": splits}
             | "join" >> beam.CoGroupByKey()
             | "by shard" >> beam.FlatMap(_by_shard, d.shards) | "shard" >> beam.GroupByKey()
             | "write" >> beam.Map(_write_shard, str(parts), index))
        _ = (done | "refused" >> beam.Filter(lambda r: r["reason"] is not None)
             | "facts" >> beam.Map(_row) | "all refused" >> beam.combiners.ToList()
             | "write refused" >> beam.Map(_write_rows, str(parts / "refused.rows")))


# -- what runs in Beam's workers: the local path's functions, one file or shard at a time

def _decode(item: tuple[int, str, str], spec, image_dir: str, out: str) -> dict:
    """One file: read once, hashed, decoded and stored (or refused and quarantined)."""
    from tfmlops import faults
    from tfmlops.data.store import Stored, read_file, store_bytes
    from tfmlops.stages.prepare.images import unsupported
    from tfmlops.stages.prepare.stream import quarantine

    i, path, label = item
    faults.point("beam.decode")
    url = is_url(path)
    rel = path[len(image_dir.rstrip("/")) + 1:] if url else str(Path(path).relative_to(image_dir))
    reason = unsupported(Path(path))
    data = None if reason else (_read_url(path) if url else read_file(path))
    sha, stored = ((hashlib.sha256(data).hexdigest(), store_bytes(data, spec))
                   if isinstance(data, bytes) else (None, data or Stored(reason=reason)))
    if not stored.ok:
        if not url:
            quarantine(Path(out), rel, Path(path))
        elif isinstance(data := data or _read_url(path), bytes):  # an unreadable one: listed only
            quarantine(Path(out), rel, data)
    return {"i": i, "file": rel, "label": label, "sha": sha, "reason": stored.reason,
            "size": len(data) if sha else 0, "stored": stored}


def _read_url(path: str):
    """The bytes of a file URL, or a refused `Stored` saying why they cannot be read."""
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.data.store import Stored

    try:
        with FileSystems.open(path) as fh:
            return fh.read()
    except Exception as exc:  # noqa: BLE001 - the store's error is this file's reason
        return Stored(reason=f"unreadable: {_first(exc)}")


def _split_class(group, classes: list[str], seed: int, val: float, test: float):
    from tfmlops.stages.prepare.images import assign_splits

    label, shas = group
    yield from assign_splits([(sha, classes[label]) for sha in shas], seed, val, test).items()


def _by_shard(joined, shards: int):
    """Each file of one content with its split, keyed by (split, shard)."""
    from tfmlops.stages.prepare.stream import shard_of

    sha, found = joined
    (split,) = found["split"]
    for row in found["file"]:
        yield (split, shard_of(sha, shards)), {**row, "split": split}


def _write_shard(group, parts: str, index: dict[str, int]) -> int:
    """One shard's records in the local writer's order (content hash, then listing),
    framed into its part file; its files' rows (facts, not pixels) beside it."""
    from tfmlops.data.tfrecords import frame
    from tfmlops.stages.prepare.stream import record_of

    (split, shard), rows = group
    rows = sorted(rows, key=lambda r: (r["sha"], r["i"]))
    name = Path(parts) / f"{split}-{shard:05d}"
    with open(name.with_suffix(".part"), "wb") as fh:
        for row in rows:
            fh.write(frame(record_of(row["stored"], index[row["label"]], row["sha"])))
    _write_rows([_row(r) for r in rows], str(name.with_suffix(".rows")))
    return len(rows)


def _row(row: dict) -> dict:
    """A file's row without its stored bytes (their length kept)."""
    stored = row["stored"]
    return {**row, "stored": replace(stored, data=b""), "stored_bytes": len(stored.data)}


def _write_rows(rows: list[dict], path: str) -> None:
    Path(path).write_bytes(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


def _import_beam() -> None:
    """Import Beam without its import-time warning that optional GCP libraries are
    missing (logged on the root logger, which it would also configure). Beam logs every
    bundle at INFO: only its warnings about this pipeline reach the user."""
    def quiet(record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(quiet)
    added = None if root.handlers else logging.NullHandler()
    if added:
        root.addHandler(added)  # logging.warning() would call basicConfig otherwise
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(quiet)
        if added:
            root.removeHandler(added)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # it warns of options it does not know; pipeline_options says so in one line
    logging.getLogger("apache_beam.options.pipeline_options").setLevel(logging.ERROR)
    logging.getLogger("apache_beam.io.gcp").setLevel(logging.ERROR)
    # the workers' own warnings, forwarded (they are in the workers' log already)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]
