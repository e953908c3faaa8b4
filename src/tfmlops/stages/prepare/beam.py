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
Workers share nothing with the driver but `data.beam.staging` (beam_staging): they
write shard parts, rows and quarantine copies there through Beam's filesystems, under
this run's own marked prefix; the driver copies them into data/prepared, streaming,
and removes the prefix (a later run removes those of runs that were killed).
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import time
from dataclasses import replace
from pathlib import Path

from tfmlops.artifacts import run_dir
from tfmlops.errors import ConfigError, DataError, UserError
from tfmlops.logs import children_stderr_to
from tfmlops.stages.prepare import beam_staging as staging
from tfmlops.stages.prepare.images import list_keys

log = logging.getLogger(__name__)

RUNNERS = ("DirectRunner", "PortableRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
WORKERS_LOG = "beam_workers.log"  # in reports/prepare/: what Beam's worker processes print
EMPTY = "quarantine-empty"  # staged beside quarantine/: the rejected files that are empty


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
    staging.check_staging(cfg, runner)
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
    started = time.perf_counter()
    options = pipeline_options(cfg)
    from apache_beam.io.filesystems import FileSystems

    FileSystems.set_options(options)  # the driver reads the staging URL as the workers write it
    root = cfg.data.beam.staging or str(out)  # "": the stage's own staging folder
    run = staging.RunPrefix(root).start()
    try:
        staging.remove_stale(root, run)
        return _assemble(cfg, options, image_dir, classes, files, out, run, started)
    finally:
        run.remove()


def _assemble(cfg, options, image_dir, classes, files, out: Path, run, started: float):
    """Run the pipeline into this run's prefix, then build `out` from what it staged."""
    from tfmlops.data.tfrecords import place_shards
    from tfmlops.stages.prepare.images import SPLITS, staged_path
    from tfmlops.stages.prepare.stream import finish_beam_tally, new_tally

    log.info("prepare: %d files on Apache Beam (%s), no cache: every file is decoded",
             len(files), " ".join(cfg.data.beam.options))
    workers_log = run_dir(cfg, "prepare") / WORKERS_LOG
    workers_log.parent.mkdir(parents=True, exist_ok=True)
    workers_log.write_bytes(b"")
    try:
        with children_stderr_to(workers_log):
            _run(cfg, options, image_dir, classes, files, run.base)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a worker died, the runner gave up: one line
        raise DataError(f"prepare on Apache Beam failed ({_first(exc)}); nothing was swapped "
                        f"in; its workers' log is {workers_log}; run it again, or set "
                        "data.engine: local") from None
    rows = []
    for part in run.files("*.rows"):
        with staging.open_staged(part) as fh:
            rows.extend(pickle.load(fh))
    if sorted(r["i"] for r in rows) != list(range(len(files))):
        raise DataError(f"prepare on Apache Beam returned {len(rows)} results for {len(files)} "
                        "files; nothing was swapped in (a bug: please report it)")
    parts = out / ".beam"  # fetched here, then moved to their names by the local writer's rule
    for split in SPLITS:
        fetched = {}
        for url in run.files(f"{split}-*.part"):
            name = run.relative(url)  # <split>-<shard>.part
            fetched[int(name.removesuffix(".part").rsplit("-", 1)[1])] = parts / name
            run.fetch(url, parts / name)
        place_shards(out, split, fetched)
    if parts.exists():
        parts.rmdir()
    for url in run.files("quarantine/**"):  # the rejected files' copies, as the local path's
        run.fetch(url, staged_path(out, run.relative(url)))
    for url in run.files(f"{EMPTY}/**"):
        target = staged_path(out / "quarantine", run.relative(url)[len(EMPTY) + 1:])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    tally = new_tally(cfg, None)
    finish_beam_tally(tally, rows)
    tally.decode_seconds = time.perf_counter() - started
    return tally


def _run(cfg, options, image_dir: Path, classes, files, base: str) -> None:
    import apache_beam as beam

    from tfmlops.stages.prepare.stream import store_spec

    spec, d = store_spec(cfg), cfg.data
    flags = list(d.beam.options)  # for Beam's filesystems in each worker (no credential in them)
    index = {c: i for i, c in enumerate(classes)}
    items = [(i, str(path), label) for i, (path, label) in enumerate(files)]
    with staging.pipeline(options, cfg.data.beam.deadline_s) as p:
        done = (p | "files" >> beam.Create(items) | "spread" >> beam.Reshuffle()
                | "decode" >> beam.Map(staging.on_workers(_decode, flags), spec, str(image_dir), base))
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
             | "write" >> beam.Map(staging.on_workers(_write_shard, flags), base, index))
        _ = (done | "refused" >> beam.Filter(lambda r: r["reason"] is not None)
             | "facts" >> beam.Map(_row) | "all refused" >> beam.combiners.ToList()
             | "write refused" >> beam.Map(staging.on_workers(_write_rows, flags), base,
                                          "refused.rows"))


# -- what runs in Beam's workers: the local path's functions, one file or shard at a time

def _decode(item: tuple[int, str, str], spec, image_dir: str, base: str) -> dict:
    """One file: read once, hashed, decoded and stored (or refused, and its copy staged
    under `base` for quarantine)."""
    from tfmlops import faults
    from tfmlops.data.store import Stored, read_file, store_bytes
    from tfmlops.stages.prepare.images import unsupported

    i, path, label = item
    faults.point("beam.decode")
    url = is_url(path)
    rel = path[len(image_dir.rstrip("/")) + 1:] if url else str(Path(path).relative_to(image_dir))
    reason = unsupported(Path(path))
    data = None if reason else (_read_url(path) if url else read_file(path))
    sha, stored = ((hashlib.sha256(data).hexdigest(), store_bytes(data, spec))
                   if isinstance(data, bytes) else (None, data or Stored(reason=reason)))
    if not stored.ok:  # its copy, as the local path makes it; an unreadable one: listed only
        if not url:
            _stage_quarantine(base, rel, data if isinstance(data, bytes) else Path(path))
        elif isinstance(data := data or _read_url(path), bytes):
            _stage_quarantine(base, rel, data)
    return {"i": i, "file": rel, "label": label, "sha": sha, "reason": stored.reason,
            "size": len(data) if sha else 0, "stored": stored}


def _read_url(path: str):
    """The bytes of a file URL, or a refused `Stored` saying why they cannot be read."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.data.store import Stored

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            return fh.read()
    except Exception as exc:  # noqa: BLE001 - the store's error is this file's reason
        return Stored(reason=f"unreadable: {_first(exc)}")


def _stage_quarantine(base: str, rel: str, source: bytes | Path) -> None:
    """A rejected file's copy (its bytes, or the file, a chunk at a time) at
    `quarantine/<rel>` under `base`, its name checked as the local path's copy is
    (images.name_refusal); a file that cannot be opened is listed only, as there."""
    from tfmlops.stages.prepare.images import name_refusal

    if why := name_refusal(rel):
        raise DataError(f"prepare refuses to stage {ascii(rel)[:300]}: {why} (a bug: please "
                        "report it)")
    try:
        src = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115
    except OSError:  # no permission, gone since listing
        return
    with src:
        chunk = src.read(staging.CHUNK)
        if not chunk:  # Beam's S3 writer cannot make an empty object: a token says it
            with staging.create(staging.join(base, EMPTY, rel)) as fh:
                fh.write(b"\0")
            return
        with staging.create(staging.join(base, "quarantine", rel)) as fh:
            while chunk:
                fh.write(chunk)
                chunk = src.read(staging.CHUNK)


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


def _write_shard(group, base: str, index: dict[str, int]) -> int:
    """One shard's records in the local writer's order (content hash, then listing),
    framed into its part file; its files' rows (facts, not pixels) beside it."""
    from tfmlops.data.tfrecords import frame
    from tfmlops.stages.prepare.stream import record_of

    (split, shard), rows = group
    rows = sorted(rows, key=lambda r: (r["sha"], r["i"]))
    name = f"{split}-{shard:05d}"
    with staging.create(staging.join(base, name + ".part")) as fh:
        for row in rows:
            fh.write(frame(record_of(row["stored"], index[row["label"]], row["sha"])))
    _write_rows([_row(r) for r in rows], base, name + ".rows")
    return len(rows)


def _row(row: dict) -> dict:
    """A file's row without its stored bytes (their length kept)."""
    stored = row["stored"]
    return {**row, "stored": replace(stored, data=b""), "stored_bytes": len(stored.data)}


def _write_rows(rows: list[dict], base: str, name: str) -> None:
    with staging.create(staging.join(base, name)) as fh:
        fh.write(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


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
