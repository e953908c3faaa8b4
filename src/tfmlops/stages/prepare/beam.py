"""prepare on Apache Beam (`data.engine: beam`): the engine of TFX's ExampleGen and
of Dataflow, Flink and Spark, for folders one machine's pool is too slow for.

Beam's workers call the local path's own functions on each file and shard (`store`,
`images.list_class`, `images.assign_splits`, `stream.shard_of`, `tfrecords`); what
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
Workers share nothing with the driver but `data.beam.staging` (beam_staging): they
write shard parts, row parts, the folded results and quarantine copies there through
Beam's filesystems, under this run's own marked prefix, every worker function wrapped
by `beam_staging.on_workers` (an external pool's workers start without the pipeline's
options); the driver copies the shards and copies into data/prepared, streams the rest
into manifest.json and quarantine.json, and then removes the prefix (`remove_parts`;
a later run removes those of runs that were killed).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from tfmlops.artifacts import run_dir
from tfmlops.errors import ConfigError, DataError, UserError
from tfmlops.logs import children_stderr_to
from tfmlops.stages.prepare import beam_staging as staging
from tfmlops.stages.prepare.beam_staging import error_line

log = logging.getLogger(__name__)

RUNNERS = ("DirectRunner", "PortableRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
WORKERS_LOG = "beam_workers.log"  # in reports/prepare/: what Beam's worker processes print
EMPTY = "quarantine-empty"  # staged beside quarantine/: the rejected files that are empty
FETCHED = ".beam"  # in the stage's staging folder: shard parts fetched, gone before the swap


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
               if "Unexpected pipeline runner" in str(exc) else error_line(exc))
        raise ConfigError(f"data.beam.options {flags}: {why}") from None
    if unknown:
        raise ConfigError(f"data.beam.options: Beam knows no option {sorted(unknown)}; fix or "
                          "remove it (e.g. --runner=DirectRunner --direct_num_workers=2)")
    staging.check_staging(cfg, runner)
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
    workers' parts under this run's staging prefix (`beam_fold`), read while the
    manifest and quarantine.json are written; `remove_parts` then removes the prefix
    (here, if the run fails first)."""
    started = time.perf_counter()
    options = pipeline_options(cfg)  # first: it imports Beam without its import-time warning
    from apache_beam.io.filesystems import FileSystems

    FileSystems.set_options(options)  # the driver reads the staging URL as the workers write it
    root = cfg.data.beam.staging or str(out)  # "": the stage's own staging folder
    run = staging.RunPrefix(root).start()
    try:
        staging.remove_stale(root, run)
        classes, tally = _assemble(cfg, options, image_dir, classes, out, run)
    except BaseException:  # an error, Ctrl-C, SIGTERM: the job is cancelled already
        run.remove()
        raise
    tally.parts = run
    tally.decode_seconds = time.perf_counter() - started
    log.info("prepare: %d files on Apache Beam (%s), no cache: every file was decoded",
             tally.good + len(tally.bad), " ".join(cfg.data.beam.options))
    return classes, tally


def _assemble(cfg, options, image_dir, classes, out: Path, run):
    """Run the pipeline into this run's prefix, then take back what it staged: the
    shards and quarantine copies into `out`, the tally and its streams."""
    from tfmlops.data.tfrecords import place_shards
    from tfmlops.stages.prepare.beam_fold import check_all_folded, read_part, read_results
    from tfmlops.stages.prepare.beam_listing import CLASSES, listing_refusal
    from tfmlops.stages.prepare.images import SPLITS, staged_path
    from tfmlops.stages.prepare.stream import warn_across_classes

    workers_log = run_dir(cfg, "prepare") / WORKERS_LOG
    workers_log.parent.mkdir(parents=True, exist_ok=True)
    workers_log.write_bytes(b"")
    quiet = logging.getLogger("apache_beam.runners.common")  # the in-process runner's
    quiet.addFilter(_without_user_errors)
    try:
        with children_stderr_to(workers_log):
            _run(cfg, options, image_dir, classes, run.base)
    except Exception as exc:  # noqa: BLE001 - a worker died, the runner gave up: one line
        refused = listing_refusal(run.base)  # a listing's own line (the in-process
        if refused:  # runner re-raises it with Beam's step name appended)
            raise DataError(refused) from None
        if isinstance(exc, UserError):
            raise
        raise DataError(f"prepare on Apache Beam failed ({error_line(exc)}); nothing was "
                        f"swapped in; its workers' log is {workers_log}; run it again, or set "
                        "data.engine: local") from None
    finally:
        quiet.removeFilter(_without_user_errors)
    classes = json.loads(read_part(run.base, CLASSES))
    fetched = out / FETCHED  # here, then moved to their names by the local writer's rule
    for split in SPLITS:
        parts = {}
        for url in run.files(f"{split}-*.part"):
            name = run.relative(url)  # <split>-<shard>.part
            parts[int(name.removesuffix(".part").rsplit("-", 1)[1])] = fetched / name
            run.fetch(url, fetched / name)
        place_shards(out, split, parts)
    if fetched.exists():
        fetched.rmdir()
    for url in run.files("quarantine/**"):  # the rejected files' copies, as the local path's
        run.fetch(url, staged_path(out, run.relative(url)))
    for url in run.files(f"{EMPTY}/**"):
        target = staged_path(out / "quarantine", run.relative(url)[len(EMPTY) + 1:])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    contract = cfg.data.contract
    tally, (shared, example) = read_results(
        run.base, contract.profile and contract.leakage.severity != "off")
    check_all_folded(run.base, tally)
    if shared:
        warn_across_classes(shared, example[1])
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
    """Remove this run's staging prefix (the workers' parts) once the manifest and
    quarantine.json are written, or once the stage failed; the local engine's: nothing."""
    if tally is not None and tally.parts is not None:
        tally.parts.remove()
        tally.parts = None


def _run(cfg, options, image_dir, classes, base: str) -> None:
    with staging.pipeline(options, cfg.data.beam.deadline_s) as p:
        build_pipeline(p, cfg, image_dir, classes, base)


def build_pipeline(p, cfg, image_dir, classes: list[str] | None, base: str) -> None:
    """prepare's transforms on pipeline `p`, writing under `base` (this run's staging
    prefix): the job graph holds the class folders (or the folder URL), never a file
    (test_beam_driver.py). Every step that reads or writes through Beam's filesystems
    runs wrapped by `staging.on_workers`."""
    import apache_beam as beam

    from tfmlops.stages.prepare import beam_fold as bf
    from tfmlops.stages.prepare.beam_listing import expand, listing_items
    from tfmlops.stages.prepare.stream import store_spec

    spec, d, contract = store_spec(cfg), cfg.data, cfg.data.contract
    flags = list(d.beam.options)  # for Beam's filesystems in each worker (no credential in them)

    def on_workers(fn):
        return staging.on_workers(fn, flags)

    # the driver hands over class folders (or the folder URL), never a file
    listed = (p | "folders" >> beam.Create(listing_items(image_dir, classes))
              | "list" >> beam.FlatMap(on_workers(expand), base)
              .with_outputs("classes", main="files"))
    names = (p | "classes" >> beam.Create(classes)) if classes else listed.classes
    known = beam.pvalue.AsList(names)
    _ = (names | "all classes" >> beam.combiners.ToList()
         | "write classes" >> beam.Map(on_workers(_write_classes), base))
    done = (listed.files | "spread" >> beam.Reshuffle()
            | "decode" >> beam.Map(on_workers(_decode), spec, base))
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
               | "write" >> beam.FlatMap(on_workers(_write_shard), base, known))
    refused = (done | "refused" >> beam.Filter(lambda r: r["reason"] is not None)
               | "facts" >> beam.Map(_row))
    _ = ((written, refused) | "rows" >> beam.Flatten()
         | "fold" >> beam.CombineGlobally(bf.TallyFold(
             contract.tiny.side if contract.profile else None))
         | "write tally" >> beam.Map(on_workers(bf.write_tally), base))
    _ = (listed.files | "count" >> beam.combiners.Count.Globally()
         | "write count" >> beam.Map(on_workers(bf.write_listed), base))
    _ = (refused | "all refused" >> beam.combiners.ToList()
         | "write refused" >> beam.Map(on_workers(bf.write_refused), base))
    _ = (written | "contents" >> beam.Map(lambda r: (r["sha"], (r["label"], r["file"])))
         | "by content" >> beam.GroupByKey()
         | "shared" >> beam.FlatMap(bf.shared_content)
         | "across classes" >> beam.CombineGlobally(bf.AcrossClasses())
         | "write across" >> beam.Map(on_workers(bf.write_across), base))
    if contract.profile and contract.leakage.severity != "off":
        _ = (written | "hashes" >> beam.Map(bf.leakage_facts)
             | "all hashes" >> beam.combiners.ToList()
             | "leakage" >> beam.Map(on_workers(bf.write_leakage), base, contract.leakage))


# -- what runs in Beam's workers: the local path's functions, one file or shard at a time

def _write_classes(classes: list[str], base: str) -> None:
    from tfmlops.stages.prepare.beam_fold import write_part
    from tfmlops.stages.prepare.beam_listing import CLASSES

    write_part(base, CLASSES, json.dumps(sorted(classes)).encode())


def label_index(classes: list[str]) -> dict[str, int]:
    """{class: index} of the classes a side input hands over (in any order)."""
    return _label_index(tuple(classes))


@functools.lru_cache(maxsize=4)
def _label_index(classes: tuple[str, ...]) -> dict[str, int]:
    return {c: i for i, c in enumerate(sorted(classes))}


def _decode(entry: tuple, spec, base: str) -> dict:
    """One file: read once, hashed, decoded and stored (or refused, and its copy staged
    under `base` for quarantine); one refused by the listing (a symlink out of the
    folder) is neither read nor copied."""
    from tfmlops import faults
    from tfmlops.data.store import Stored, read_file, store_bytes
    from tfmlops.stages.prepare.images import unsupported

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
    if not stored.ok:  # its copy, as the local path makes it; an unreadable one: listed only
        if not url:
            _stage_quarantine(base, rel, data if isinstance(data, bytes) else Path(path))
        elif isinstance(data := data or _read_url(path), bytes):
            _stage_quarantine(base, rel, data)
    return {"key": key, "file": rel, "label": label, "sha": sha, "reason": stored.reason,
            "size": len(data) if sha else 0, "stored": stored, "listed": False}


def _read_url(path: str):
    """The bytes of a file URL, or a refused `Stored` saying why they cannot be read."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.data.store import Stored

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            return fh.read()
    except Exception as exc:  # noqa: BLE001 - the store's error is this file's reason
        return Stored(reason=f"unreadable: {error_line(exc)}")


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
    names = sorted(classes)
    yield from assign_splits([(sha, names[label]) for sha in shas], seed, val, test).items()


def _by_shard(joined, shards: int):
    """Each file of one content with its split, keyed by (split, shard)."""
    from tfmlops.stages.prepare.stream import shard_of

    sha, found = joined
    (split,) = found["split"]
    for row in found["file"]:
        yield (split, shard_of(sha, shards)), {**row, "split": split}


def _write_shard(group, base: str, classes: list[str]):
    """One shard's records in the local writer's order (content hash, then listing),
    framed into its part file under `base`; its manifest rows beside it
    (beam_fold.write_rows_part); its files' rows (facts, not pixels) on, to be folded."""
    from tfmlops.data.tfrecords import frame
    from tfmlops.stages.prepare.beam_fold import write_rows_part
    from tfmlops.stages.prepare.stream import record_of

    index = label_index(classes)
    (split, shard), rows = group
    rows = sorted(rows, key=lambda r: (r["sha"], r["key"]))
    name = f"{split}-{shard:05d}"
    with staging.create(staging.join(base, f"{name}.part")) as fh:
        for row in rows:
            fh.write(frame(record_of(row["stored"], index[row["label"]], row["sha"])))
    write_rows_part(base, name, rows)
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

