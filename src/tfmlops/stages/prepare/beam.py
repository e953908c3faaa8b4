"""prepare on Apache Beam (`data.engine: beam`): the engine of TFX's ExampleGen and
of Dataflow, Flink and Spark, for folders one machine's pool is too slow for.

Beam's workers call the local path's own functions on each file and shard (`store`,
`stream.quarantine`, `images.assign_splits`, `stream.shard_of`, `tfrecords`); what
Beam adds is where they run and how results meet:

    class folders -> files (listed by the workers: beam_listing) -> decode (per file)
          -> owner class of each content (min class index)
          -> split per class (GroupByKey class) -> join back by content hash
          -> (split, shard) groups, sorted by (hash, listing) -> one shard file each,
             and its manifest rows sorted by file
          -> one small row per file (no pixels) -> combiners and single-worker steps
             (beam_fold) -> small parts the driver reads

The driver (this process) holds nothing per file (test_beam_driver.py): it reads the
folded `Tally` and streams the row parts into manifest.json, so the output is the
local path's byte for byte (test_beam.py): every piece of it is defined without an
order (a shard is a function of the content hash, records sorted within it,
statistics exact sums).

Always cold: no `prepare_cache`, no hash memo (docs/scaling.md, "Millions of images").
Workers write the shard parts and quarantine copies into the staging folder, so
they must share its filesystem (true of the in-process runner and of a worker
pool on this machine).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

from tfmlops.artifacts import run_dir
from tfmlops.errors import ConfigError, DataError, UserError
from tfmlops.logs import children_stderr_to
from tfmlops.stages.prepare.beam_listing import error_line

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


def beam_classes(cfg, image_dir) -> list[str] | None:
    """What the driver lists before the run: the class folders of a local
    data.image_dir (O(classes)); None for a folder URL, whose workers list it whole
    (beam_listing). A URL with data.engine: local fails here in one line."""
    if not is_url(image_dir):
        from tfmlops.stages.prepare.images import list_classes

        return list_classes(Path(image_dir))
    if cfg.data.engine != "beam":
        raise DataError(f"data.image_dir {image_dir} is a URL: only data.engine: beam reads "
                        "URLs; set it, or copy the images to a local folder")
    return None


def prepare_beam(cfg, image_dir: Path | str, classes: list[str] | None, out: Path):
    """`stream.prepare_stream` on Apache Beam: the same shards, quarantine and tally;
    (the classes, the tally). The tally's rows and refused files are streams over the
    workers' parts (`beam_fold`), read while the manifest and quarantine.json are
    written; `remove_parts` then removes them."""
    from tfmlops.data.tfrecords import place_shards
    from tfmlops.stages.prepare.images import SPLITS
    from tfmlops.stages.prepare.stream import warn_across_classes

    started = time.perf_counter()
    options = pipeline_options(cfg)  # first: it imports Beam without its import-time warning
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.stages.prepare.beam_fold import read_part, read_results
    from tfmlops.stages.prepare.beam_listing import CLASSES, listing_refusal

    FileSystems.set_options(options)
    parts = out / PARTS
    parts.mkdir(parents=True)
    workers_log = run_dir(cfg, "prepare") / WORKERS_LOG
    workers_log.parent.mkdir(parents=True, exist_ok=True)
    workers_log.write_bytes(b"")
    quiet = logging.getLogger("apache_beam.runners.common")  # the in-process runner's
    quiet.addFilter(_without_user_errors)
    try:
        with children_stderr_to(workers_log):
            _run(cfg, options, image_dir, classes, out, str(parts))
    except Exception as exc:  # noqa: BLE001 - a worker died, the runner gave up: one line
        refused = listing_refusal(str(parts))  # a listing's own line (the in-process
        if refused:  # runner re-raises it with Beam's step name appended)
            raise DataError(refused) from None
        if isinstance(exc, UserError):
            raise
        raise DataError(f"prepare on Apache Beam failed ({_first(exc)}); nothing was "
                        f"swapped in; its workers' log is {workers_log}; run it again, or set "
                        "data.engine: local") from None
    finally:
        quiet.removeFilter(_without_user_errors)
    classes = json.loads(read_part(str(parts), CLASSES))
    for split in SPLITS:  # the parts under the local writer's names
        place_shards(out, split, {int(p.stem.rsplit("-", 1)[1]): p
                                  for p in parts.glob(f"{split}-*.part")})
    contract = cfg.data.contract
    tally, (shared, example) = read_results(
        str(parts), contract.profile and contract.leakage.severity != "off")
    if shared:
        warn_across_classes(shared, example[1])
    tally.parts = str(parts)
    tally.decode_seconds = time.perf_counter() - started
    log.info("prepare: %d files on Apache Beam (%s), no cache: every file was decoded",
             tally.good + len(tally.bad), " ".join(cfg.data.beam.options))
    return classes, tally


def _without_user_errors(record: logging.LogRecord) -> bool:
    """False for Beam's log of a worker's one-line error (a listing's refusal), which the
    driver raises itself: the user sees that line once, without Beam's traceback."""
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if isinstance(exc, UserError):
            return False
        exc = exc.__cause__ or exc.__context__
    return True


def remove_parts(tally) -> None:
    """Remove the workers' parts once the manifest and quarantine.json are written."""
    if tally.parts is not None:
        shutil.rmtree(tally.parts)
        tally.parts = None


def _run(cfg, options, image_dir, classes, out: Path, parts: str) -> None:
    import apache_beam as beam

    with beam.Pipeline(options=options) as p:
        build_pipeline(p, cfg, image_dir, classes, out, parts)


def build_pipeline(p, cfg, image_dir, classes: list[str] | None, out: Path, parts: str) -> None:
    """prepare's transforms on pipeline `p`: the job graph holds the class folders (or
    the folder URL), never a file (test_beam_driver.py)."""
    import apache_beam as beam

    from tfmlops.stages.prepare import beam_fold as bf
    from tfmlops.stages.prepare.beam_listing import CLASSES, expand, listing_items
    from tfmlops.stages.prepare.stream import store_spec

    spec, d, contract = store_spec(cfg), cfg.data, cfg.data.contract
    # the driver hands over class folders (or the folder URL), never a file
    listed = (p | "folders" >> beam.Create(listing_items(image_dir, classes))
              | "list" >> beam.FlatMap(expand, parts).with_outputs("classes", main="files"))
    names = (p | "classes" >> beam.Create(classes)) if classes else listed.classes
    known = beam.pvalue.AsList(names)
    _ = (names | "all classes" >> beam.combiners.ToList()
         | "write classes" >> beam.Map(lambda c: bf.write_part(
             parts, CLASSES, json.dumps(sorted(c)).encode())))
    done = (listed.files | "spread" >> beam.Reshuffle()
            | "decode" >> beam.Map(_decode, spec, str(image_dir), str(out)))
    good = done | "good" >> beam.Filter(lambda r: r["reason"] is None)
    splits = (good | "owner" >> beam.Map(lambda r, c: (r["sha"], label_index(c)[r["label"]]),
                                         known)
              | "first class" >> beam.CombinePerKey(min)  # the listing's first (images.py)
              | "by class" >> beam.Map(lambda kv: (kv[1], kv[0]))
              | "class" >> beam.GroupByKey()
              | "split" >> beam.FlatMap(_split_class, known, cfg.seed, d.split.val,
                                        d.split.test))
    written = ({"file": good | "by hash" >> beam.Map(lambda r: (r["sha"], r)),
                "split": splits}
               | "join" >> beam.CoGroupByKey()
               | "by shard" >> beam.FlatMap(_by_shard, d.shards)
               | "shard" >> beam.GroupByKey()
               | "write" >> beam.FlatMap(_write_shard, parts, known))
    refused = (done | "refused" >> beam.Filter(lambda r: r["reason"] is not None)
               | "facts" >> beam.Map(_row))
    _ = ((written, refused) | "rows" >> beam.Flatten()
         | "fold" >> beam.CombineGlobally(bf.TallyFold(
             contract.tiny.side if contract.profile else None))
         | "write tally" >> beam.Map(bf.write_tally, parts))
    _ = (refused | "all refused" >> beam.combiners.ToList()
         | "write refused" >> beam.Map(bf.write_refused, parts))
    _ = (written | "contents" >> beam.Map(lambda r: (r["sha"], (r["label"], r["file"])))
         | "by content" >> beam.GroupByKey()
         | "shared" >> beam.FlatMap(bf.shared_content)
         | "across classes" >> beam.CombineGlobally(bf.AcrossClasses())
         | "write across" >> beam.Map(bf.write_across, parts))
    if contract.profile and contract.leakage.severity != "off":
        _ = (written | "hashes" >> beam.Map(bf.leakage_facts)
             | "all hashes" >> beam.combiners.ToList()
             | "leakage" >> beam.Map(bf.write_leakage, parts, contract.leakage))


# -- what runs in Beam's workers: the local path's functions, one file or shard at a time

def label_index(classes: list[str]) -> dict[str, int]:
    """{class: index} of the classes a side input hands over (in any order)."""
    return _label_index(tuple(classes))


@functools.lru_cache(maxsize=4)
def _label_index(classes: tuple[str, ...]) -> dict[str, int]:
    return {c: i for i, c in enumerate(sorted(classes))}


def _decode(entry: tuple, spec, image_dir: str, out: str) -> dict:
    """One file: read once, hashed, decoded and stored (or refused and quarantined);
    one refused by the listing (a symlink out of the folder) is neither read nor copied."""
    from tfmlops import faults
    from tfmlops.data.store import Stored, read_file, store_bytes
    from tfmlops.stages.prepare.images import unsupported
    from tfmlops.stages.prepare.stream import quarantine

    key, path, label, listed = entry
    faults.point("beam.decode")
    url = is_url(path)
    rel = "/".join(key)
    if listed:
        return {"key": key, "file": rel, "label": label, "sha": None, "reason": listed,
                "size": 0, "stored": Stored(reason=listed), "listed": True}
    reason = unsupported(Path(path))
    data = None if reason else (_read_url(path) if url else read_file(path))
    sha, stored = ((hashlib.sha256(data).hexdigest(), store_bytes(data, spec))
                   if isinstance(data, bytes) else (None, data or Stored(reason=reason)))
    if not stored.ok:
        if not url:
            quarantine(Path(out), rel, Path(path))
        elif isinstance(data := data or _read_url(path), bytes):  # an unreadable one: listed only
            quarantine(Path(out), rel, data)
    return {"key": key, "file": rel, "label": label, "sha": sha, "reason": stored.reason,
            "size": len(data) if sha else 0, "stored": stored, "listed": False}


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
    names = sorted(classes)
    yield from assign_splits([(sha, names[label]) for sha in shas], seed, val, test).items()


def _by_shard(joined, shards: int):
    """Each file of one content with its split, keyed by (split, shard)."""
    from tfmlops.stages.prepare.stream import shard_of

    sha, found = joined
    (split,) = found["split"]
    for row in found["file"]:
        yield (split, shard_of(sha, shards)), {**row, "split": split}


def _write_shard(group, parts: str, classes: list[str]):
    """One shard's records in the local writer's order (content hash, then listing),
    framed into its part file; its manifest rows beside it (beam_fold.write_rows_part);
    its files' rows (facts, not pixels) on, to be folded."""
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.data.tfrecords import frame
    from tfmlops.stages.prepare.beam_fold import write_rows_part
    from tfmlops.stages.prepare.stream import record_of

    index = label_index(classes)
    (split, shard), rows = group
    rows = sorted(rows, key=lambda r: (r["sha"], r["key"]))
    name = f"{split}-{shard:05d}"
    with FileSystems.create(FileSystems.join(parts, f"{name}.part")) as fh:
        for row in rows:
            fh.write(frame(record_of(row["stored"], index[row["label"]], row["sha"])))
    write_rows_part(parts, name, rows)
    yield from (_row(r) for r in rows)


def _row(row: dict) -> dict:
    """A file's row without its stored bytes (their length kept)."""
    stored = row["stored"]
    return {**row, "stored": replace(stored, data=b""), "stored_bytes": len(stored.data)}


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
    # the workers' own warnings and errors, forwarded (they are in the workers' log
    # already; a failed run names it, or raises a worker's one-line refusal itself)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(
        logging.CRITICAL)


def _first(exc: BaseException) -> str:
    return error_line(exc)
