"""The sections of params.yaml as frozen pydantic dataclasses.

Each class owns its keys: their types, their defaults, their numeric ranges
(`Field` bounds), their choices (`Literal`) and the rules that span several of
its keys (a validator on the class). They are stdlib dataclasses too:
`dataclasses.replace` re-validates, assignment raises FrozenInstanceError.
Nothing here imports TensorFlow or MLflow.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from tfmlops.compress.variants import CONVERTED_VARIANTS, QAT_INT8, TFLITE_VARIANTS
from tfmlops.config.messages import Rule, field_bounds, field_info

_SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)
section = dataclass(frozen=True, config=_SECTION)

# Values are taken as written: no "yes" for true, no "3" or 3.0 for 3, no inf.
Int = StrictInt
Bool = StrictBool
Float = Annotated[float, Field(strict=True)]  # an integer is taken as a float
Text = Annotated[str, StringConstraints(strict=True, min_length=1)]

Optimizer = Literal["adam", "adamw", "rmsprop", "sgd", "lamb"]
Schedule = Literal[
    "constant", "exponential_decay", "cosine_decay", "cosine_warmup", "piecewise_constant"
]
Backbone = Literal["none", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
                   "resnet50"]
OPTIMIZERS = typing.get_args(Optimizer)
SCHEDULES = typing.get_args(Schedule)
BACKBONES = typing.get_args(Backbone)
IMAGENET = "imagenet"  # model.backbone_weights: Keras' own ImageNet weights


def _copies(*values):
    """A default_factory: a fresh list per instance."""
    return Field(default_factory=lambda: list(values))


# --------------------------------------------------------------------------- data

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


@section
class AugmentConfig:
    enabled: Bool = False
    flip: Bool = False  # digits are not mirror-symmetric: off by default
    rotation: Float = Field(0.05, ge=0.0, le=0.5)  # fraction of a full turn
    zoom: Float = Field(0.1, ge=0.0, le=0.9)
    translate: Float = Field(0.1, ge=0.0, le=0.5)


# pipeline settings that change speed, not batches: a backup, a tuner state or a
# cache made with other values of these is still the same
SPEED_ONLY = ("autotune", "cache", "cache_budget_mb")


@section
class PipelineConfig:
    shuffle_buffer: Int = Field(2048, ge=1, le=10_000_000)
    # Where the decoded split is kept after the first epoch. auto: memory when
    # the train split's decoded float32 images fit cache_budget_mb, else a file
    # under paths.cache; memory | disk | off force one.
    cache: Literal["auto", "memory", "disk", "off"] = "auto"
    cache_budget_mb: Int = Field(1024, ge=0, le=10_000_000)
    deterministic: Bool = True
    # tf.data's autotuner records every element; once the cache serves the
    # epochs that cost halves steady-state throughput on 2 cores, so parallel
    # stages default to one call per core instead (benchmarks/input_pipeline.py).
    autotune: Bool = False
    augment: AugmentConfig = Field(default_factory=AugmentConfig)

    def without_speed_settings(self) -> dict[str, Any]:
        """The settings that change which batches a run sees (not how fast it gets them)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in SPEED_ONLY}

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_old_spelling(cls, value):
        # The old true/false still mean memory/off (YAML reads a bare `off` as false too).
        return {True: "memory", False: "off"}.get(value, value) if isinstance(value, bool) else value


# -------------------------------------------------------------------------- model

@section
class BlockSpec:
    filters: Int = Field(32, ge=1, le=4096)
    kernel_size: Int = Field(3, ge=1, le=15)
    separable: Bool = False


@section
class ModelSpec:
    """The architecture as data; `tfmlops.model.builder.build_model` builds it."""

    # Keras applications that build in Keras 3 and tf_keras with equal weight lists
    # (model/backbones.py; prune rebuilds the trained model in tf_keras).
    backbone: Backbone = "none"
    # "imagenet" (Keras' cache, downloaded when online), a local weights file of the
    # backbone without its top (Keras' *_notop.h5 or a saved .weights.h5), or null.
    backbone_weights: Text | None = None
    blocks: list[BlockSpec] = _copies(BlockSpec(32, 3, False), BlockSpec(64, 3, False))
    convs_per_block: Int = Field(2, ge=1, le=4)
    batch_norm: Bool = True
    # Keras' default 0.99 averages ~100 steps: too slow for short runs on small
    # data (validation then sees stale statistics and scores near chance).
    bn_momentum: Float = Field(0.9, ge=0.0, lt=1.0)
    dropout: Float = Field(0.25, ge=0.0, le=0.9)
    pooling: Literal["max", "avg"] = "max"
    head_units: Int = Field(128, ge=0, le=8192)
    activation: Literal["relu", "relu6", "swish", "gelu", "elu"] = "relu"
    squeeze_excite: Bool = False

    @field_validator("backbone_weights")
    @classmethod
    def _weights_file_exists(cls, path):
        # A missing file would fail only when the first model is built, minutes into
        # tune. "imagenet" is checked at the start of tune/train (it may need the network).
        if path is not None and path != IMAGENET and not Path(path).is_file():
            raise Rule(f"{{path}}: {path!r} is not a file (relative paths start at the "
                       "project root); give a local weights file, imagenet or null")
        return path

    @model_validator(mode="after")
    def _has_a_body(self):
        if self.backbone == "none" and not self.blocks:
            raise Rule("{p}blocks: empty; give at least one block or a backbone")
        return self


# ---------------------------------------------------------------------- training

@section
class OptimizerConfig:
    name: Optimizer = "adam"
    learning_rate: Float = Field(0.002, gt=0.0, le=10.0)
    weight_decay: Float = Field(0.0001, ge=0.0, le=1.0)
    momentum: Float = Field(0.9, ge=0.0, lt=1.0)
    clipnorm: Float | None = Field(None, gt=0.0, le=1e6)  # null: no clipping


@section
class ScheduleConfig:
    name: Schedule = "cosine_warmup"
    warmup_fraction: Float = Field(0.1, ge=0.0, le=0.9)
    decay_rate: Float = Field(0.5, gt=0.0, le=1.0)
    alpha: Float = Field(0.01, ge=0.0, le=1.0)  # cosine floor as a fraction of the peak
    boundaries: list[Float] = _copies(0.5, 0.75)  # fractions of the total steps
    # multipliers of the peak, len(boundaries)+1; 0 or less would stop or reverse descent
    factors: list[Annotated[Float, Field(gt=0.0, le=1000.0)]] = _copies(1.0, 0.1, 0.01)

    @model_validator(mode="after")
    def _piecewise_steps(self):
        if len(self.factors) != len(self.boundaries) + 1:
            raise Rule(f"{{p}}factors: needs len(boundaries)+1 = {len(self.boundaries) + 1} "
                       f"values, got {len(self.factors)}")
        b = self.boundaries
        if any(not 0 < x < 1 for x in b) or b != sorted(b):
            raise Rule(f"{{p}}boundaries: {b} must be increasing fractions in (0, 1)")
        return self


@section
class LossConfig:
    name: Literal["crossentropy", "focal"] = "crossentropy"
    label_smoothing: Float = Field(0.0, ge=0.0, le=0.5)
    gamma: Float = Field(2.0, ge=0.0, le=10.0)


@section
class FineTuneConfig:
    """Two-phase transfer learning; only used when model.backbone is not none."""

    enabled: Bool = True  # false: one phase, the whole backbone trainable
    head_epochs: Int = Field(5, ge=0, le=10_000)  # phase 1: backbone frozen, head only
    # phase 2: the top layers of the backbone trainable: a count (int) or a fraction
    # of its layers (float in [0, 1]); BatchNormalization stays in inference mode.
    unfreeze: Int | Float = Field(0.25, ge=0, le=10_000)
    lr_factor: Float = Field(0.1, gt=0.0, le=10.0)  # phase 2 learning rate = this x peak

    @field_validator("unfreeze")
    @classmethod
    def _count_or_fraction(cls, value):
        if isinstance(value, float) and value > 1.0:
            raise Rule(f"{{path}}: {value} is neither a fraction in [0, 1] nor a whole number "
                       "of layers; give e.g. 0.25 or 20")
        return value


@section
class TrainConfig:
    epochs: Int = Field(20, ge=1, le=10_000)
    batch_size: Int = Field(64, ge=1, le=65_536)  # per replica
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    reduce_lr_on_plateau: Bool = False  # only with schedule.name == constant
    early_stopping_patience: Int = Field(6, ge=0, le=10_000)  # 0 turns it off
    # auto: from the hardware and the architecture (never timed); timed: the faster on
    # this machine, float32 unless bf16 is faster by more than precision_margin.
    precision: Literal["auto", "timed", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    # above the spread of two timings of one policy (benchmarks/precision.py noise)
    precision_margin: Float = Field(0.15, ge=0.0, le=10.0)
    strategy: Literal["auto", "default", "mirrored", "multi_worker"] = "auto"
    replicas: Int = Field(1, ge=1, le=64)
    jit_compile: Literal["auto", "true", "false"] = "false"
    use_tuned: Bool = True
    fine_tune: FineTuneConfig = Field(default_factory=FineTuneConfig)
    # Dotted keys ("optimizer.learning_rate", "model.dropout", "batch_size") that
    # win over the tune stage's best hyperparameters.
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("overrides")
    @classmethod
    def _overrides_name_real_keys(cls, overrides):
        # A typo here is otherwise found only when tune's final round or train
        # merges the overrides, after the whole search.
        for key, value in overrides.items():
            full = override_key(key)
            info = _overridable(full)
            if info is None:
                raise Rule(f"{{path}}: {key!r} is not a key of model or train{_near(full)}; "
                           "use dotted keys such as optimizer.learning_rate or model.dropout")
            try:
                TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
            except ValidationError as exc:
                raise Rule(f"{{path}}: {key}: {value!r} is not accepted for {full} "
                           f"({exc.errors()[0]['msg']}); give a value {full} accepts") from None
        return overrides

    @model_validator(mode="after")
    def _plateau_needs_a_constant_schedule(self):
        if self.reduce_lr_on_plateau and self.schedule.name != "constant":
            raise Rule(f"{{p}}reduce_lr_on_plateau: only works with {{p}}schedule.name: "
                       f"constant, not {self.schedule.name!r}")
        return self


# ------------------------------------------------------------------------ tuning

@section
class IntRange:
    min: Int = Field(1, ge=1)
    max: Int = 1
    step: Int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise Rule(f"{{path}}: min {self.min} > max {self.max}; give min <= max")
        return self


@section
class FloatRange:
    min: Float = Field(0.0, ge=0.0)
    max: Float = 0.0

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise Rule(f"{{path}}: min {self.min} > max {self.max}; give min <= max")
        return self


def _nonempty(item):
    """A list of choices with at least one (a one-value list is a fixed value)."""
    return Annotated[list[item], Field(min_length=1)]


_Filters = _nonempty(Annotated[Int, Field(ge=1, le=4096)])
_HeadUnits = _nonempty(Annotated[Int, Field(ge=1, le=8192)])
_BatchSizes = _nonempty(Annotated[Int, Field(ge=1, le=65_536)])
_Flags = _nonempty(Bool)
_Optimizers = _nonempty(Optimizer)
_Schedules = _nonempty(Schedule)
_Backbones = _nonempty(Backbone)


@section
class SearchSpace:
    """What tune searches. The field names are the hyperparameter names
    (`HP_NAMES`); `SEARCHED_PARAMS` says which params key each one sets."""

    blocks: IntRange = Field(default_factory=lambda: IntRange(1, 3, 1))
    filters: _Filters = _copies(16, 32)  # first block; each next block doubles it
    separable: _Flags = _copies(False, True)
    batch_norm: _Flags = _copies(True, False)
    dropout: FloatRange = Field(default_factory=lambda: FloatRange(0.0, 0.4))
    head_units: _HeadUnits = _copies(64, 128)
    optimizer: _Optimizers = _copies("adam", "adamw")
    learning_rate: FloatRange = Field(  # sampled on a log scale
        default_factory=lambda: FloatRange(5e-4, 5e-3))
    schedule: _Schedules = _copies("constant", "cosine_warmup", "exponential_decay")
    warmup_fraction: FloatRange = Field(default_factory=lambda: FloatRange(0.0, 0.2))
    decay_rate: FloatRange = Field(default_factory=lambda: FloatRange(0.3, 0.9))
    batch_size: _BatchSizes = _copies(32, 64)
    # Transfer learning; null: not searched (params' own value). A backbone trial
    # ignores blocks/filters/separable/batch_norm.
    backbone: _Backbones | None = None
    head_epochs: IntRange | None = None
    unfreeze: FloatRange | None = None  # a fraction of the backbone's layers
    lr_factor: FloatRange | None = None  # sampled on a log scale

    @model_validator(mode="after")
    def _each_value_once(self):
        for name in HP_NAMES:
            values = getattr(self, name)
            if isinstance(values, list):
                dupes = sorted({repr(v) for v in values if values.count(v) > 1})
                if dupes:
                    raise Rule(f"{{p}}{name}: {dupes[0]} is listed twice; list each value once")
        return self

    @model_validator(mode="after")
    def _ranges_within_their_keys(self):
        # tune: each sampled value must also be a valid setting of the key it sets.
        for name, key in SEARCHED_PARAMS.items():
            r = getattr(self, name)
            if not isinstance(r, FloatRange):
                continue
            low, high, open_low, _ = field_bounds(field_info(Config, key.split(".")))
            if r.min < low or (open_low and r.min == low) or r.max > high:
                left = "(" if open_low else "["
                raise Rule(f"{{p}}{name}: [{r.min}, {r.max}] is outside {left}{low}, {high}]; "
                           "narrow the range")
        return self


HP_NAMES = tuple(f.name for f in dataclasses.fields(SearchSpace))
# The params key each searched name sets. blocks, filters and separable are
# missing on purpose: together they set model.blocks (count, first width, kind).
SEARCHED_PARAMS = {
    "batch_norm": "model.batch_norm", "dropout": "model.dropout",
    "head_units": "model.head_units", "optimizer": "train.optimizer.name",
    "learning_rate": "train.optimizer.learning_rate", "schedule": "train.schedule.name",
    "warmup_fraction": "train.schedule.warmup_fraction",
    "decay_rate": "train.schedule.decay_rate", "batch_size": "train.batch_size",
    "backbone": "model.backbone", "head_epochs": "train.fine_tune.head_epochs",
    "unfreeze": "train.fine_tune.unfreeze", "lr_factor": "train.fine_tune.lr_factor",
}


@section
class TuneConfig:
    enabled: Bool = True
    tuner: Literal["hyperband", "bayesian", "random"] = "hyperband"
    objective: Literal["val_accuracy", "val_loss"] = "val_accuracy"
    max_trials: Int = Field(12, ge=1, le=100_000)
    max_epochs: Int = Field(6, ge=1, le=10_000)
    budget_minutes: Float = Field(30.0, gt=0.0, le=100_000.0)  # a guard, not a setting
    early_stopping_patience: Int = Field(2, ge=0, le=1000)
    hyperband_factor: Int = Field(3, ge=2, le=100)
    # The params' own settings and the search's best N are trained at
    # train.epochs; the winner (ties: the params') is the tuned configuration.
    final_candidates: Int = Field(1, ge=0, le=100)
    # A trial whose model has more parameters fails (recorded FAILED) and the
    # search goes on: keeps the search within an edge size budget. 0: no limit.
    max_model_params: Int = Field(0, ge=0)
    space: SearchSpace = Field(default_factory=SearchSpace)


# ---------------------------------------------------------------- compression

@section
class PruneConfig:
    initial_sparsity: Float = Field(0.0, ge=0.0, lt=1.0)
    final_sparsity: Float = Field(0.85, ge=0.0, lt=1.0)
    epochs: Int = Field(30, ge=1, le=10_000)  # fine-tuning epochs
    begin_fraction: Float = Field(0.0, ge=0.0, lt=1.0)
    end_fraction: Float = Field(0.5, gt=0.0, le=1.0)  # final sparsity reached here
    frequency: Int = Field(5, ge=1, le=1_000_000)  # steps between mask updates
    learning_rate: Float = Field(1e-3, gt=0.0, le=10.0)

    @model_validator(mode="after")
    def _sparsity_grows(self):
        if self.final_sparsity < self.initial_sparsity:
            raise Rule(f"{{p}}final_sparsity: {self.final_sparsity} < initial_sparsity "
                       f"{self.initial_sparsity}; final must be >= initial")
        if self.end_fraction <= self.begin_fraction:
            raise Rule(f"{{p}}end_fraction: must be > begin_fraction ({self.begin_fraction})")
        return self


def _only_of(names: list, allowed: tuple, what: str) -> list:
    """`names` if each is in `allowed`, else a Rule naming the first that is not."""
    bad = sorted(set(names) - set(allowed))
    if bad:
        raise Rule(f"{{path}}: {bad[0]!r} is not {what}; use some of {', '.join(allowed)}")
    return names


@section
class QuantizeConfig:
    representative_samples: Int = Field(200, ge=1, le=10_000_000)
    qat: Bool = False
    qat_epochs: Int = Field(2, ge=1, le=1000)
    qat_learning_rate: Float = Field(1e-4, gt=0.0, le=1.0)
    accuracy_budget: Float = Field(0.01, ge=0.0, le=1.0)  # points lost vs Keras, as a fraction
    # The edge variant: the smallest file within the budget, or the fastest (p50).
    edge_pick: Literal["smallest", "fastest"] = "smallest"
    required: list[Text] = _copies("int8")  # variants whose failure fails the stage
    # The variants converted from each model (trained and pruned); every conversion is
    # evaluated and timed, so a shorter list is a faster stage.
    variants: list[Text] = _copies(*CONVERTED_VARIANTS)
    latency_runs: Int = Field(200, ge=1, le=1_000_000)
    latency_warmup: Int = Field(20, ge=0, le=1_000_000)
    threads: Int = Field(1, ge=1, le=256)

    @field_validator("required")
    @classmethod
    def _known_variants(cls, required):
        return _only_of(required, TFLITE_VARIANTS, "a variant")

    @field_validator("variants")
    @classmethod
    def _converted_variants(cls, chosen):
        if not chosen:
            raise Rule(f"{{path}}: empty; list at least one of {', '.join(CONVERTED_VARIANTS)}")
        return _only_of(chosen, CONVERTED_VARIANTS, "a converted variant")

    @model_validator(mode="after")
    def _qat_variant_needs_qat(self):
        if QAT_INT8 in self.required and not self.qat:
            raise Rule(f"{{p}}required: lists {QAT_INT8} but {{p}}qat is false; "
                       f"set {{p}}qat: true or remove {QAT_INT8}")
        missing = sorted(set(self.required) - set(self.variants) - {QAT_INT8})
        if missing:
            raise Rule(f"{{p}}required: lists {missing[0]} but {{p}}variants does not build it; "
                       f"add it to {{p}}variants or remove it from {{p}}required")
        return self


@section
class ServingLimits:
    """What one request to the served model may cost. Export writes them into
    serving.json; the served model refuses beyond them with HTTP 400, naming the key."""

    max_rows: Int = Field(1024, ge=1, le=1_000_000)
    # Pixels one image row's header may claim (width x height), checked before decoding.
    max_image_pixels: Int = Field(4096 * 4096, ge=64, le=2**31)
    # The image rows' header pixels summed over one request: bounds its CPU time.
    max_request_pixels: Int = Field(64 * 2**20, ge=64, le=2**40)
    # What decoding one request's images holds (header pixels x bytes per pixel of their
    # mode: 2 for 16-bit grey, 3 for RGB, 4 for RGBA), summed: bounds its memory.
    max_request_decoded_bytes: Int = Field(256 * 2**20, ge=256, le=2**42)
    # The HTTP request body `tfmlops serve` reads at most (413 beyond, before parsing).
    max_body_bytes: Int = Field(64 * 2**20, ge=1024, le=2**34)
    # Images one server process decodes at once (the rest wait): bounds its memory.
    max_concurrent_decodes: Int = Field(2, ge=1, le=256)

    @model_validator(mode="after")
    def _one_image_fits_a_request(self):
        if self.max_image_pixels > self.max_request_pixels:
            raise Rule(f"{{p}}max_image_pixels {self.max_image_pixels} is above "
                       f"{{p}}max_request_pixels {self.max_request_pixels}; one image must fit "
                       "in a request")
        return self


@section
class SkewLimits:
    """export's skew report: how many original files it follows through both paths, and the
    top-1 agreement they must keep (the stored JPEG's re-encoding is the one difference
    between prepare's path and the served model's on an original file)."""

    source_images: Int = Field(64, ge=0, le=100_000)  # 0: the source pair is not measured
    source_min_agreement: Float = Field(0.95, ge=0.0, le=1.0)
    # The SavedModel's in-graph decoding vs prepare's (Pillow, OpenCV) on the originals.
    source_max_grey_levels: Int = Field(1, ge=0, le=255)


@section
class ExportConfig:
    model_name: Text = "digits"  # one folder name: saved_model/<model_name>/<version>
    onnx_opset: Int = Field(17, ge=9, le=23)
    atol: Float = Field(1e-4, ge=0.0, le=1.0)
    latency_runs: Int = Field(200, ge=1, le=1_000_000)
    serving: ServingLimits = Field(default_factory=ServingLimits)
    skew: SkewLimits = Field(default_factory=SkewLimits)

    @field_validator("model_name")
    @classmethod
    def _one_folder_name(cls, name):
        # It becomes a path under paths.export: "../x" or "a/b" would write elsewhere.
        if not MODEL_NAME.fullmatch(name):
            raise Rule(f"{{path}}: {name!r} is not a plain name; use letters, digits, '.', "
                       "'_' and '-', starting with a letter or digit (no '/' or '..')")
        return name


@section
class GateConfig:
    min_accuracy: Float = Field(0.95, ge=0.0, le=1.0)
    max_regression: Float = Field(0.005, ge=0.0, le=1.0)
    max_size_bytes: Int = Field(5_000_000, ge=1)
    max_latency_ms: Float = Field(20.0, gt=0.0)
    require_parity: Bool = True


@section
class PromoteConfig:
    registered_model: Text = "digits-classifier"
    gate: GateConfig = Field(default_factory=GateConfig)
    fail_pipeline: Bool = False
    # A `dvc exp run` is tentative until applied and committed: its version gets
    # @exp-<name>, never @production, unless this is true.
    from_experiments: Bool = False
    # A promotion lock not renewed for this long (its holder died) may be broken.
    lock_lease_s: Float = Field(60.0, ge=1.0, le=3600.0)


# -------------------------------------------------------------------- shared

@section
class TrackingConfig:
    enabled: Bool = True
    experiment: Text = "tfmlops"
    # Used only when MLFLOW_TRACKING_URI is unset; relative sqlite paths are
    # resolved against the repository root (never a `dvc exp --temp` copy).
    uri: Text = "sqlite:///mlflow.db"
    connect_timeout_s: Float = Field(5.0, ge=0.1, le=600.0)
    retries: Int = Field(3, ge=0, le=20)


@section
class ProfilingConfig:
    enabled: Bool = True
    start_step: Int = Field(5, ge=1, le=1_000_000)  # skip warm-up and tracing steps
    steps: Int = Field(3, ge=1, le=1000)
    # Runs kept per stage under paths.profiles/<stage>/, for TensorBoard side by side.
    keep_runs: Int = Field(5, ge=1, le=1000)


@section
class PathsConfig:
    """Every path the pipeline reads or writes; dvc.yaml reads these too (${paths.*})."""

    builtin: Text = "data/builtin"  # materialize: the built-in dataset as class folders
    prepared: Text = "data/prepared"  # prepare: TFRecords, manifest.json, stats.json
    cache: Text = "data/cache"  # train input: pipeline.cache's disk files, one folder per data
    prepare_cache: Text = "data/prepare_cache"  # prepare: per-image results by content hash
    tuner: Text = "data/tuner"  # tune: keras-tuner state, kept between runs
    tuned: Text = "models/tuned"  # tune: best_hparams.yaml
    train: Text = "models/train"  # train: model.keras
    backup: Text = "models/train_backup"  # train: BackupAndRestore state, kept on a kill
    pruned: Text = "models/pruned"  # prune: the pruned tf_keras model
    tflite: Text = "models/tflite"  # quantize: every .tflite variant
    export: Text = "models/export"  # export: SavedModel, ONNX, edge TFLite
    reports: Text = "reports"  # metrics and plots of every stage
    profiles: Text = "reports/profiles"  # TensorFlow Profiler traces, per stage


@section
class Config:
    seed: Int = Field(42, ge=0, le=2**31 - 1)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    model: ModelSpec = Field(default_factory=ModelSpec)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tune: TuneConfig = Field(default_factory=TuneConfig)
    prune: PruneConfig = Field(default_factory=PruneConfig)
    quantize: QuantizeConfig = Field(default_factory=QuantizeConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    promote: PromoteConfig = Field(default_factory=PromoteConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    profiling: ProfilingConfig = Field(default_factory=ProfilingConfig)

    @model_validator(mode="after")
    def _search_space_can_be_built(self):
        # model/search_space.check_fits's rules, here so `tfmlops check` sees them; on
        # Config because the pooling limit depends on data.image_size. The image rule
        # first: for too many blocks it is the one that names the key to change.
        space, size = self.tune.space, self.data.image_size
        pools = space.blocks.max - 1  # the last block feeds global pooling
        if size // 2**pools < 1:
            raise Rule(f"tune.space.blocks.max: {space.blocks.max} blocks pool {pools} times, "
                       f"more than a {size}x{size} input allows (at most {size.bit_length()} "
                       "blocks); lower it or raise data.image_size")
        # each next block doubles the first width: the last must stay a valid width
        most = field_bounds(field_info(BlockSpec, ["filters"]))[1]
        widest = max(space.filters) * 2**pools
        if widest > most:
            raise Rule(f"tune.space.filters: {max(space.filters)} doubled over "
                       f"{space.blocks.max} blocks is {widest} filters, above {most}; "
                       "lower tune.space.filters or tune.space.blocks.max")
        return self

    @model_validator(mode="after")
    def _backbones_fit_the_images(self):
        # Keras applications take inputs of at least 32x32 (model/builder.check_buildable)
        size = self.data.image_size
        for key, names in (("model.backbone", [self.model.backbone]),
                           ("tune.space.backbone", self.tune.space.backbone or [])):
            big = [n for n in names if n != "none"]
            if big and size < 32:
                raise Rule(f"{key}: {big[0]} needs inputs of at least 32x32, data.image_size is "
                           f"{size}; raise data.image_size or use backbone: none")
        return self

    @model_validator(mode="after")
    def _paths_are_not_the_projects_own(self):
        # Every paths.* folder is written, swapped in or pruned by tfmlops (caches
        # evict, backups empty, profiles keep the newest runs): none may be a place
        # whose content is not the pipeline's.
        from tfmlops.project import refusal

        for key, value in dataclasses.asdict(self.paths).items():
            why = refusal(value, self.tracking.uri)
            if why:
                raise Rule(f"paths.{key}: {value!r} {why}, where tfmlops would delete or "
                           f"replace files; give paths.{key} a folder of its own (default "
                           f"{getattr(PathsConfig(), key)!r})")
        return self

    @model_validator(mode="after")
    def _paths_do_not_overlap(self):
        # Outputs are swapped in whole (files.swap_in): an output folder that equals
        # or holds another path, or the user's images, would move it aside and
        # delete it. Two overlaps are by design: data.image_dir defaults to
        # paths.builtin (materialize writes what prepare reads), and
        # paths.profiles lies inside paths.reports (plain files, never swapped).
        named = {f"paths.{k}": v for k, v in dataclasses.asdict(self.paths).items()}
        named["data.image_dir"] = self.data.image_dir
        allowed = {("data.image_dir", "paths.builtin", "equals"),
                   ("paths.profiles", "paths.reports", "is inside")}
        keys = list(named)
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                found = _overlap(a, Path(named[a]), b, Path(named[b]))
                if found is None or found in allowed:
                    continue
                inner, outer, how = found
                first, verb, second = (outer, "holds", inner) if how == "is inside" \
                    else (inner, "equals", outer)
                raise Rule(f"{first}: {named[first]!r} {verb} {second} {named[second]!r}; give "
                           "each of paths.* and data.image_dir its own folder, none inside "
                           "another")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self, *sections: str) -> str:
        """A short hash of the resolved config (or of some sections)."""
        d = self.to_dict()
        if sections:
            d = {s: d[s] for s in sections}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# -------------------------------------------------------------- helpers

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def override_key(key: str) -> str:
    """A train.overrides key as a full dotted params key (bare keys are train's)."""
    return key if key.split(".")[0] in ("model", "train") else f"train.{key}"


def _overridable(full: str):
    """The FieldInfo of a model/train key an override may set, else None."""
    parts = full.split(".")
    if parts[:2] == ["train", "overrides"] or len(parts) < 2:
        return None
    return field_info(Config, parts)


def _near(full: str) -> str:
    """ (did you mean model.x?) for the closest real model/train key."""
    keys = [k for section in (ModelSpec, TrainConfig) for k in _dotted_keys(section)]
    # a bare key is train's, but a user may have meant the model key of that name
    tries = [full, "model." + full.removeprefix("train.")]
    scored = [(difflib.SequenceMatcher(None, t, k).ratio(), k) for t in tries for k in keys]
    ratio, best = max(scored)
    return f" (did you mean {best}?)" if ratio >= 0.8 else ""


def _dotted_keys(cls: type, prefix: str = "") -> list[str]:
    prefix = prefix or {ModelSpec: "model.", TrainConfig: "train."}.get(cls, "")
    out = []
    for name, info in cls.__pydantic_fields__.items():
        sub = info.annotation
        out.append(prefix + name)
        if hasattr(sub, "__pydantic_fields__"):
            out += _dotted_keys(sub, f"{prefix}{name}.")
    return out


def _overlap(key_a: str, a: Path, key_b: str, b: Path) -> tuple[str, str, str] | None:
    """(inner key, outer key, "equals" | "is inside") when two resolved paths overlap."""
    a, b = a.resolve(), b.resolve()
    if a == b:
        return (*sorted((key_a, key_b)), "equals")
    if b in a.parents:
        return key_a, key_b, "is inside"
    if a in b.parents:
        return key_b, key_a, "is inside"
    return None
