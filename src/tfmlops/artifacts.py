"""The names of everything one stage hands to another, and the check that it is there.

A stage writes its outputs under `paths.<stage>` and `reports/`; later stages,
tests and benchmarks read them by these names, never by a literal of their own.
`require` is the one "run the upstream stage first" check: a missing input fails
with one line naming the file and the `dvc repro` that makes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tfmlops.errors import DataError

# -- files in a stage's output folder, by the stage that writes them
RUN_FILE = "mlflow_run.json"  # every stage: its run's id and store (lineage); see run_dir
# beside a run file: held while a detached run is delivered (tracking/sidecar.py)
DELIVERY_LOCK = ".delivering.lock"
# beside it: held (shared) by each run waiting for its turn to be delivered, so a reader
# also waits for a run handed over while an earlier one was still being delivered
DELIVERY_QUEUE = ".delivery-queue.lock"
DETACHED_LOG = "tracking.log"  # beside it: the log of that delivery
# beside paths.reports (the project's, git-ignored): hard links of what runs log (sidecar.py)
SCRATCH = ".tfmlops/scratch"
DATA_VERSION = "data_version"  # in prepare's run file: the data version its run made
MANIFEST = "manifest.json"  # prepare: label map, counts, the files and their hashes
STATS = "stats.json"  # prepare: per-channel mean and std of the train split
QUARANTINE = "quarantine.json"  # prepare: every rejected file and why
BEST_HPARAMS = "best_hparams.yaml"  # tune: the partial params tree train merges
SEARCHED = "searched_params.json"  # tune: what the search read (train refuses it stale)
FINAL_ROUND = "final_round.csv"  # tune
# tune and train: the timed precision decisions, per architecture (in paths.tuner; tune
# copies the file to paths.tuned, where train reads the one it trained)
PRECISION = "precision.json"
MODEL_FILE = "model.keras"  # train and prune
RESOLVED_PARAMS = "resolved_params.yaml"  # train: the config really trained
TUNE_MERGE = "tune_merge.json"  # train: what tune changed
EDGE = "edge.json"  # quantize: the edge variant chosen
FRONTIER_PNG = "frontier.png"  # quantize
SERVING = "serving.json"  # export: the served runtime and its settings
SKEW = "skew.json"  # export: every served path against Keras
REGISTERED = "registered.json"  # export: {name, version, run_id, model_uri}
FORMATS_CSV = "export_formats.csv"  # export, in reports/: every format's size, speed, parity
MODEL_CARD = "model_card.md"  # export
LABEL_ISSUES_CSV = "label_issues.csv"  # train, in reports/: flagged label issues, lowest p(given) first
LABEL_ISSUES_PNG = "label_issues.png"  # train, in reports/: their contact sheet
EVALUATION = "promote_evaluation"  # promote: reports/<this>.json, candidate vs production
EVALUATED_CSV = "evaluated_images.csv"  # promote, in reports/promote/: every evaluated image
RELIABILITY_PNG = "reliability.png"  # promote: both versions' reliability diagrams
CONFUSION_PNG = "confusion_{version}.png"  # promote: one per evaluated version
PREPARED_MANIFEST = "prepared/" + MANIFEST  # artifact path of the manifest in prepare's run
# `tfmlops compare A B`, in reports/compare/<A>-<B>/ and its `compare` run
COMPARE_MD = "compare.md"  # the comparison, thumbnails by relative path
COMPARE_HTML = "compare.html"  # the same, thumbnails inline (data URIs): the MLflow UI shows it
COMPARE_JSON = "compare.json"  # the same as data (`tfmlops compare --json`)
FLIPPED_DIR = "flipped"  # beside them: a PNG thumbnail per listed flipped image

# in reports/: the folder of the stages' headline files, dvc.yaml's `metrics:` (headline_path)
HEADLINES = "metrics"

# -- prepare's data contract, in reports/ (data.contract)
DATA_PROFILE = "data_profile.json"  # counts, histograms, leakage, anomalies
DATA_PROFILE_CLASSES = "data_profile_classes.csv"  # dvc plots: images per class and split
DATA_PROFILE_FEATURES = "data_profile_features.csv"  # dvc plots: each feature's histogram
DATA_PROFILE_PNG = "data_profile.png"  # the prepare run's figure (in the run only)

# -- MLflow tags other stages or the registry read
TAG_STAGE = "tfmlops.stage"
TAG_DATA_VERSION = "tfmlops.data_version"
TAG_EDGE_VARIANT = "tfmlops.edge_variant"
TAG_SERVED_RUNTIME = "tfmlops.export.served_runtime"
TAG_PARITY_PASSED = "tfmlops.export.parity"
TAG_TUNE_SEARCH = "tfmlops.tune.search"
TAG_PROMOTE = "tfmlops.promote."  # prefix: action, outcome, candidate, production_before/after
TAG_COMPARE = "tfmlops.compare."  # prefix: kind, a, b and (two versions) model

# -- registered-version tags export writes and promote's gate reads
TAG_ACCURACY = "serving.accuracy"
TAG_BYTES = "serving.bytes"
TAG_LATENCY = "serving.latency_p50_ms"
TAG_PARITY = "parity.passed"
TAG_EDGE_AGREEMENT = "edge.top1_agreement"  # the INT8 edge file vs the float model (quantize)
TAG_LINEAGE_RUN = "lineage.run."  # prefix: + stage, the run id of each upstream stage
TAG_LINEAGE_DATA = "lineage.data_version"
TAG_LINEAGE_COMMIT = "lineage.git_commit"


def report_path(reports: str | Path, stage: str, suffix: str = ".json") -> Path:
    """`reports/<stage>.json` (or another suffix: `_history.csv`...): a stage's report,
    every figure it has (scripts and checks read it; a plain DVC output)."""
    return Path(reports) / f"{stage}{suffix}"


def headline_path(reports: str | Path, stage: str) -> Path:
    """`reports/metrics/<stage>.json`: the few figures of its report a person compares
    between experiments (StageSpec.headline), the stage's DVC metrics file."""
    return Path(reports) / HEADLINES / f"{stage}.json"


def run_dir(cfg, stage: str) -> Path:
    """The folder of stage `stage`'s `mlflow_run.json`, as its SPEC declares it: its output
    folder, but `reports/<stage>/` for prepare and promote. prepare's output is the data
    alone, byte for byte the same from either engine and any rerun (a run id in it would
    make DVC rerun every later stage); promote has no output folder."""
    from tfmlops.stage_spec import spec

    return spec(stage).run_dir(cfg)


def data_version(prepared: str | Path) -> str:
    """The data version of a prepared folder: the first 16 hex digits of its manifest's
    sha256 (the `tfmlops.data_version` tag, the dataset digest), or "none" without one."""
    manifest = Path(prepared) / MANIFEST
    if not manifest.is_file():
        return "none"
    digest = hashlib.sha256()
    with manifest.open("rb") as fh:  # in chunks: a manifest of millions of files is GBs
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def read_manifest(prepared: str | Path, what: str | None = None) -> dict:
    """prepare's manifest (label map, counts, files) in the folder `prepared`, parsed;
    `require`'s one-line DataError, naming `what`, when prepare has not made it."""
    return json.loads(require(Path(prepared) / MANIFEST, "prepare", what).read_text())


def require(path: str | Path, stage: str, what: str | None = None, *, hint: str = "") -> Path:
    """`path` if it exists, else DataError: `<what> not found; run dvc repro <stage> first`."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{what or path} not found; run `dvc repro {stage}` first{hint}")
    return path
