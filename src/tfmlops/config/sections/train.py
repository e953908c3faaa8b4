"""train: optimizer, schedule, loss, fine-tuning and the tuned values' overrides."""

from __future__ import annotations

import difflib
import typing
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from tfmlops.config.messages import Rule, field_info
from tfmlops.config.sections.base import Bool, Float, Int, copies, section
from tfmlops.config.sections.model import ModelSpec

Optimizer = Literal["adam", "adamw", "rmsprop", "sgd", "lamb"]
Schedule = Literal[
    "constant", "exponential_decay", "cosine_decay", "cosine_warmup", "piecewise_constant"
]
OPTIMIZERS = typing.get_args(Optimizer)
SCHEDULES = typing.get_args(Schedule)


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
    boundaries: list[Float] = copies(0.5, 0.75)  # fractions of the total steps
    # multipliers of the peak, len(boundaries)+1; 0 or less would stop or reverse descent
    factors: list[Annotated[Float, Field(gt=0.0, le=1000.0)]] = copies(1.0, 0.1, 0.01)

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
    # val and test images the model finds least likely to carry their label, kept in
    # reports/label_issues.csv and a contact sheet; 0 turns it off
    label_issues: Int = Field(50, ge=0, le=10_000)
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


def override_key(key: str) -> str:
    """A train.overrides key as a full dotted params key (bare keys are train's)."""
    return key if key.split(".")[0] in ("model", "train") else f"train.{key}"


def model_or_train_field(key: str):
    """The FieldInfo of a dotted model.* or train.* params key, else None (read from the
    two sections, not Config: Config is built from this module)."""
    first, *rest = key.split(".")
    section_of = {"model": ModelSpec, "train": TrainConfig}.get(first)
    return field_info(section_of, rest) if section_of is not None else None


def _overridable(full: str):
    """The FieldInfo of a model/train key an override may set, else None."""
    parts = full.split(".")
    if parts[:2] == ["train", "overrides"] or len(parts) < 2:
        return None
    return model_or_train_field(full)


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

