"""data: the images prepare reads, their split and how they are stored."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Bool, Float, Int, Text, copies, section

Severity = Literal["error", "warn", "off"]  # error fails prepare, warn logs a line, off: no check


@section
class SyntheticConfig:
    """The built-in RGB shapes dataset, used for scale and RGB tests."""

    count: Int = Field(1200, ge=20, le=10_000_000)
    image_size: Int = Field(32, ge=8, le=1024)
    classes: Int = Field(4, ge=2, le=6)


@section
class SplitConfig:
    val: Float = Field(0.15, gt=0.0, le=0.5)
    test: Float = Field(0.15, gt=0.0, le=0.5)
    # A class with no image in some split (too few images: 3 reach every split):
    # error stops prepare naming the class; warn logs that and goes on.
    too_few: Literal["error", "warn"] = "error"

    @model_validator(mode="after")
    def _leaves_a_train_split(self):
        if self.val + self.test >= 0.9:
            raise Rule(f"{{p}}val + {{p}}test = {self.val + self.test}; keep it below 0.9")
        return self


@section
class StoreConfig:
    """How `prepare` stores each image: at a bounded size, in a chosen encoding."""

    # The stored short side in pixels (aspect kept, never enlarged); 0: data.image_size,
    # what training reads. A margin above it keeps detail for zoom augmentation.
    short_side: Int = Field(0, ge=0, le=8192)
    # auto: JPEG for JPEG/MPO sources (photos), PNG for the others (small, lossless).
    encoding: Literal["auto", "jpeg", "png"] = "auto"
    jpeg_quality: Int = Field(90, ge=50, le=100)


@section
class LeakageConfig:
    """Near-duplicates across splits, by perceptual hash (data.leakage)."""

    # Hamming distance between two 64-bit pHashes that makes a pair near-duplicates. The
    # search splits the hash into max_distance + 1 chunks: above 8 it nears all pairs.
    max_distance: Int = Field(4, ge=0, le=8)
    # Share of the val and test images with a near-duplicate in another split that is
    # tolerated; above it, `severity` applies.
    max_share: Float = Field(0.01, ge=0.0, le=1.0)
    severity: Severity = "warn"  # off: not searched
    listed: Int = Field(100, ge=0, le=100_000)  # pairs named in data_profile.json


@section
class SeverityConfig:
    """What each anomaly against the reference profile does (data.drift)."""

    class_appeared: Severity = "error"
    class_vanished: Severity = "error"
    class_share: Severity = "warn"
    feature_drift: Severity = "warn"
    new_format: Severity = "warn"
    tiny_images: Severity = "warn"


@section
class TinyConfig:
    side: Int = Field(32, ge=1, le=8192)  # a source short side below this is tiny
    max_share_change: Float = Field(0.02, ge=0.0, le=1.0)  # over the reference's share


@section
class ContractConfig:
    """The data contract `prepare` checks: profile, leakage, drift against a reference."""

    profile: Bool = True  # false: no profile, no leakage search, no drift check
    # The accepted profile (`tfmlops accept-reference`), a dependency of prepare in dvc.yaml.
    reference: Text = "data/reference_profile.json"
    max_class_share_change: Float = Field(0.05, ge=0.0, le=1.0)
    max_feature_distance: Float = Field(0.15, ge=0.0, le=1.0)  # Jensen-Shannon, base 2
    tiny: TinyConfig = Field(default_factory=TinyConfig)
    leakage: LeakageConfig = Field(default_factory=LeakageConfig)
    severity: SeverityConfig = Field(default_factory=SeverityConfig)


@section
class BeamConfig:
    """prepare on Apache Beam (`data.engine: beam`): Beam's own pipeline options, passed
    through, so `--runner=DataflowRunner --project=... --region=...` needs no code. The
    default runs on this machine and downloads nothing (a named Python runner: Beam's
    default may fetch its Go runner first); --direct_num_workers=0 is one per core."""

    options: list[Text] = copies("--runner=DirectRunner", "--direct_running_mode=multi_processing",
                                 "--direct_num_workers=0")


@section
class DataConfig:
    # The class-per-folder images prepare reads. The default is where the
    # `materialize` stage writes the built-in dataset; point it at your own.
    image_dir: Text = "data/builtin"
    builtin: Literal["digits", "synthetic"] = "digits"
    image_size: Int = Field(32, ge=8, le=1024)
    channels: Literal[1, 3] = 1
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_bad_fraction: Float = Field(0.05, ge=0.0, le=1.0)
    shards: Int = Field(2, ge=1, le=1024)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    workers: Int = Field(0, ge=0, le=1024)  # prepare's decoding processes; 0: every core
    store: StoreConfig = Field(default_factory=StoreConfig)
    contract: ContractConfig = Field(default_factory=ContractConfig)
    # local: this machine's process pool and prepare_cache (incremental); beam: Apache Beam
    # (data.beam), always cold; both write the same data/prepared, byte for byte.
    engine: Literal["local", "beam"] = "local"
    beam: BeamConfig = Field(default_factory=BeamConfig)

    @model_validator(mode="after")
    def _stores_at_least_what_training_reads(self):
        if 0 < self.store.short_side < self.image_size:
            raise Rule(f"{{p}}store.short_side: {self.store.short_side} is below {{p}}image_size "
                       f"{self.image_size}; give 0 (= image_size) or at least {self.image_size}")
        return self

    @model_validator(mode="after")
    def _fits_this_machine(self):
        from tfmlops.config.machine import check_data

        problem = check_data(self.shards, self.workers)
        if problem:
            raise Rule(problem)
        return self

    @field_validator("channels", mode="before")
    @classmethod
    def _channels_as_written(cls, value):
        # Literal[1, 3] alone takes true and 1.0 for 1.
        if type(value) is not int:
            raise PydanticCustomError("literal_error", "Input should be 1 or 3")
        return value
