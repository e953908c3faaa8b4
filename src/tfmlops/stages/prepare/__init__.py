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
`quarantine.json` and a copy of every rejected file: the data alone, the same bytes
from either engine (`data.engine`: local, this machine's pool and cache; beam, Apache
Beam, always cold: data.beam), so DVC reruns nothing after an unchanged prepare. Its
run's `mlflow_run.json` is in `reports/prepare/` with the data version it made. In `paths.reports`: the data
contract's `data_profile.json` and its plots (data.contract: profile, near-duplicates
across splits, anomalies against the accepted reference profile).

The checks, the manifest and the metrics are data.manifest's; the lock, the
staging folder, the swap-in, the run and reports/prepare.json the harness's. This
process imports neither TensorFlow (the TFRecords are written directly,
`data.tfrecords`) nor MLflow (the tracking sidecar keeps the run; as a command,
prepare hands it the finished run and exits, and the sidecar imports MLflow and
delivers it then: harness `detach`), so an incremental run costs little more than its
new files; the input pipeline is profiled by `train`, which runs it. Bad data fails
before the run opens: no run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tfmlops import faults, harness
from tfmlops.artifacts import (
    DATA_VERSION,
    MANIFEST,
    QUARANTINE,
    STATS,
    TAG_DATA_VERSION,
    data_version,
)
from tfmlops.files import write_json, write_json_streamed
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

SPEC = StageSpec(
    name="prepare",
    help="validate images, split them, write TFRecords, manifest and statistics",
    output="prepared",
    params=("seed", "data", "pipeline"),
    reports=("prepare.json", "data_profile_classes.csv"),
    headline=("images_good", "images_bad", "classes", "train_images", "val_images",
              "test_images", "leakage_pairs", "anomalies"),
    sidecar=True,
    run_in_reports=True,
    detach=True,
)
log = logging.getLogger(__name__)


def run(cfg: Config) -> dict[str, float]:
    from tfmlops.stages.prepare.beam import beam_classes, is_url, prepare_beam, remove_parts
    from tfmlops.stages.prepare.contract import check_contract, log_profile
    from tfmlops.stages.prepare.images import SPLITS, list_files
    from tfmlops.stages.prepare.manifest import build_manifest, check_tally, prepare_metrics, prepare_params
    from tfmlops.stages.prepare.stream import prepare_stream

    url = is_url(cfg.data.image_dir)  # gs://, s3://: read through Beam's filesystems
    image_dir = cfg.data.image_dir.rstrip("/") if url else Path(cfg.data.image_dir)
    beam = cfg.data.engine == "beam" or url  # a URL with the local engine: refused in one line
    with harness.stage(cfg, SPEC, params=prepare_params(cfg)) as st:
        listing = time.perf_counter()
        # Beam: only the class folders here (a URL: none), the files listed by its workers
        classes, files, refused = ((beam_classes(cfg, image_dir), None, None) if beam
                                   else list_files(image_dir))
        list_seconds = time.perf_counter() - listing
        faults.point("prepare.listed")
        started = time.perf_counter()
        if beam:
            classes, tally = prepare_beam(cfg, image_dir, classes, st.out)
        else:
            tally = prepare_stream(cfg, image_dir, classes, files, st.out)
            # Refused by what they are (symlinks out of image_dir): listed, never read or
            # copied (on Beam, its listing workers find these too).
            tally.bad.extend({"file": str(b.path.relative_to(image_dir)), "label": b.label,
                              "reason": b.reason} for b in refused)
        try:
            check_tally(cfg, image_dir, classes, tally)
            contract = check_contract(cfg, classes, tally)  # profile, leakage, drift: may refuse
            manifest = build_manifest(cfg, image_dir, classes, tally)
            write_json_streamed(st.out / MANIFEST, manifest, "files")
            faults.point("json.manifest")
            write_json_streamed(st.out / QUARANTINE, tally.bad)
        finally:  # Beam's staging prefix: what the two files were streamed from
            remove_parts(tally)
        mean, std = tally.mean_std()
        write_json(st.out / STATS, {"mean": mean, "std": std})
        metrics = prepare_metrics(tally, time.perf_counter() - started, len(classes),
                                  list_seconds) | contract
        # The run opens only now, the data checked: bad data leaves no run.
        version = st.run_facts[DATA_VERSION] = data_version(st.out)
        st.run.set_tags({TAG_DATA_VERSION: version})
        st.report(metrics)
        st.run.log_dataset(str(image_dir).rsplit("/", 1)[-1] or "images",
                           image_dir if url else str(image_dir.resolve()), version,
                           context="training")
        final = st.swap()
        faults.point("swap.done")
        # From where they now are: the sidecar reads each file after this call returns.
        for name in (MANIFEST, STATS, QUARANTINE):
            st.run.log_artifact(final / name, "prepared")
        log_profile(cfg, st.run)
        if tally.cache is not None:  # only once the new output is in place
            tally.cache.compact(tally.hashes)
        faults.point("prepare.compacted")
    counts = manifest["split_counts"]
    log.info(f"prepare: {tally.good} images ({len(tally.bad)} quarantined) in {len(classes)} "
             f"classes -> " + ", ".join(f"{s} {counts[s]}" for s in SPLITS)
             + f"; {tally.decoded} decoded, {tally.cached} from the cache")
    return metrics


def accept(cfg: Config) -> dict:
    """`tfmlops accept-reference`: the last prepare's data profile becomes the reference."""
    from tfmlops.artifacts import DATA_PROFILE
    from tfmlops.stages.prepare.drift import accept_reference

    return accept_reference(Path(cfg.paths.reports) / DATA_PROFILE, cfg.data.contract.reference)
