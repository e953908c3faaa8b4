"""data: the images prepare reads, their split and how they are stored."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, field

from tfmlops.config.credentials import credential_problem, url_problem
from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text, copies

Severity = Literal["error", "warn", "off"]  # error fails prepare, warn logs a line, off: no check


class SyntheticConfig(Section):
    """The built-in RGB shapes dataset, used for scale and RGB tests."""

    count: Annotated[int, Meta(ge=20, le=10_000_000)] = 1200
    image_size: Annotated[int, Meta(ge=8, le=1024)] = 32
    classes: Annotated[int, Meta(ge=2, le=6)] = 4


class SplitConfig(Section):
    val: Annotated[float, Meta(gt=0.0, le=0.5)] = 0.15
    test: Annotated[float, Meta(gt=0.0, le=0.5)] = 0.15
    # A class with no image in some split (too few images: 3 reach every split):
    # error stops prepare naming the class; warn logs that and goes on.
    too_few: Literal["error", "warn"] = "error"

    def _rules(self):  # leaves a train split
        if self.val + self.test >= 0.9:
            raise Rule(f"{{p}}val + {{p}}test = {self.val + self.test}; keep it below 0.9")


class StoreConfig(Section):
    """How `prepare` stores each image: at a bounded size, in a chosen encoding."""

    # The stored short side in pixels (aspect kept, never enlarged); 0: data.image_size,
    # what training reads. A margin above it keeps detail for zoom augmentation.
    short_side: Annotated[int, Meta(ge=0, le=8192)] = 0
    # auto: JPEG for JPEG/MPO sources (photos), PNG for the others (small, lossless).
    encoding: Literal["auto", "jpeg", "png"] = "auto"
    jpeg_quality: Annotated[int, Meta(ge=50, le=100)] = 90


class LeakageConfig(Section):
    """Near-duplicates across splits, by perceptual hash (data.leakage)."""

    # Hamming distance between two 64-bit pHashes that makes a pair near-duplicates. The
    # search splits the hash into max_distance + 1 chunks: above 8 it nears all pairs.
    max_distance: Annotated[int, Meta(ge=0, le=8)] = 4
    # Share of the val and test images with a near-duplicate in another split that is
    # tolerated; above it, `severity` applies.
    max_share: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01
    severity: Severity = "warn"  # off: not searched
    listed: Annotated[int, Meta(ge=0, le=100_000)] = 100  # pairs named in data_profile.json


class SeverityConfig(Section):
    """What each anomaly against the reference profile does (data.drift)."""

    class_appeared: Severity = "error"
    class_vanished: Severity = "error"
    class_share: Severity = "warn"
    feature_drift: Severity = "warn"
    new_format: Severity = "warn"
    tiny_images: Severity = "warn"


class TinyConfig(Section):
    side: Annotated[int, Meta(ge=1, le=8192)] = 32  # a source short side below this is tiny
    max_share_change: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.02  # over the reference's share


class ContractConfig(Section):
    """The data contract `prepare` checks: profile, leakage, drift against a reference."""

    profile: bool = True  # false: no profile, no leakage search, no drift check
    # The accepted profile (`tfmlops accept-reference`), a dependency of prepare in dvc.yaml.
    reference: Text = "data/reference_profile.json"
    max_class_share_change: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    max_feature_distance: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.15  # Jensen-Shannon, base 2
    tiny: TinyConfig = field(default_factory=TinyConfig)
    leakage: LeakageConfig = field(default_factory=LeakageConfig)
    severity: SeverityConfig = field(default_factory=SeverityConfig)


class BeamConfig(Section):
    """prepare on Apache Beam (`data.engine: beam`): Beam's own pipeline options, passed
    through, so `--runner=DataflowRunner --project=... --region=...` needs no code. The
    default runs on this machine and downloads nothing (a named Python runner: Beam's
    default may fetch its Go runner first); --direct_num_workers=0 is one per core."""

    options: list[Text] = copies("--runner=DirectRunner", "--direct_running_mode=multi_processing",
                                 "--direct_num_workers=0")
    # Where Beam's workers write shard parts, rows and quarantine copies, through Beam's
    # filesystems; each run under its own marked prefix, which the driver removes once
    # data/prepared is assembled. "": the stage's local staging folder (DirectRunner only).
    # A remote runner (any other) needs a place its workers and this machine both reach:
    # s3://bucket/path, gs://bucket/path, or an absolute path of a mount every worker shares.
    staging: str = ""
    # Seconds prepare waits for a job on a remote runner before it cancels it and fails
    # (0: no limit). Beam's local job service can wait forever for an SDK worker that died.
    deadline_s: Annotated[float, Meta(ge=0, le=7 * 86400)] = 0

    def _rules(self):
        # params are published (dvc.lock, MLflow, resolved_params.yaml): no credential here
        problem = credential_problem(self.options) or staging_problem(self.staging)
        if problem:
            raise Rule(problem)


def staging_problem(staging: str) -> str | None:
    """Why `data.beam.staging` cannot be a place workers write to; None if fine."""
    if not staging:
        return None
    if url_problem(staging):
        return "{p}staging " + url_problem(staging)
    scheme, sep, rest = staging.partition("://")
    if sep and scheme in ("s3", "gs") and rest.split("/", 1)[0]:
        return None
    if not sep and staging.startswith("/"):
        return None
    return ("{p}staging must be s3://BUCKET/PATH, gs://BUCKET/PATH or the absolute path of a "
            "mount every worker shares")


class DataConfig(Section):
    # The class-per-folder images prepare reads. The default is where the
    # `materialize` stage writes the built-in dataset; point it at your own.
    image_dir: Text = "data/builtin"
    builtin: Literal["digits", "synthetic"] = "digits"
    image_size: Annotated[int, Meta(ge=8, le=1024)] = 32
    channels: Literal[1, 3] = 1  # strict: true and 1.0 are refused
    split: SplitConfig = field(default_factory=SplitConfig)
    max_bad_fraction: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    shards: Annotated[int, Meta(ge=1, le=1024)] = 2
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    workers: Annotated[int, Meta(ge=0, le=1024)] = 0  # prepare's decoding processes; 0: every core
    store: StoreConfig = field(default_factory=StoreConfig)
    contract: ContractConfig = field(default_factory=ContractConfig)
    # local: this machine's process pool and prepare_cache (incremental); beam: Apache Beam
    # (data.beam), always cold; both write the same data/prepared, byte for byte.
    engine: Literal["local", "beam"] = "local"
    beam: BeamConfig = field(default_factory=BeamConfig)

    # shards and workers: static bounds only; prepare fits them to the machine it runs on
    # (config.machine.fit_to_machine), so a params.yaml's validity is the same everywhere.
    def _rules(self):
        # stores at least what training reads
        if 0 < self.store.short_side < self.image_size:
            raise Rule(f"{{p}}store.short_side: {self.store.short_side} is below {{p}}image_size "
                       f"{self.image_size}; give 0 (= image_size) or at least {self.image_size}")
