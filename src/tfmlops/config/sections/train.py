"""train: optimizer, schedule, loss, fine-tuning and the tuned values' overrides."""

from __future__ import annotations

import difflib
import typing
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field

from tfmlops.config.messages import Rule, field_info, is_section, reason
from tfmlops.config.sections.base import Section, copies
from tfmlops.config.sections.model import ModelSpec

Optimizer = Literal["adam", "adamw", "rmsprop", "sgd", "lamb"]
Schedule = Literal[
    "constant", "exponential_decay", "cosine_decay", "cosine_warmup", "piecewise_constant"
]
OPTIMIZERS = typing.get_args(Optimizer)
SCHEDULES = typing.get_args(Schedule)


class OptimizerConfig(Section):
    name: Optimizer = "adam"
    learning_rate: Annotated[float, Meta(gt=0.0, le=10.0)] = 0.002
    weight_decay: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0001
    momentum: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.9
    clipnorm: Annotated[float, Meta(gt=0.0, le=1e6)] | None = None  # null: no clipping


class ScheduleConfig(Section):
    name: Schedule = "cosine_warmup"
    warmup_fraction: Annotated[float, Meta(ge=0.0, le=0.9)] = 0.1
    decay_rate: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    alpha: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01  # cosine floor as a fraction of the peak
    boundaries: list[float] = copies(0.5, 0.75)  # fractions of the total steps
    # multipliers of the peak, len(boundaries)+1; 0 or less would stop or reverse descent
    factors: list[Annotated[float, Meta(gt=0.0, le=1000.0)]] = copies(1.0, 0.1, 0.01)

    def _rules(self):  # piecewise steps
        if len(self.factors) != len(self.boundaries) + 1:
            raise Rule(f"{{p}}factors: needs len(boundaries)+1 = {len(self.boundaries) + 1} "
                       f"values, got {len(self.factors)}")
        b = self.boundaries
        if any(not 0 < x < 1 for x in b) or b != sorted(b):
            raise Rule(f"{{p}}boundaries: {b} must be increasing fractions in (0, 1)")


class LossConfig(Section):
    name: Literal["crossentropy", "focal"] = "crossentropy"
    label_smoothing: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.0
    gamma: Annotated[float, Meta(ge=0.0, le=10.0)] = 2.0


class FineTuneConfig(Section):
    """Two-phase transfer learning; only used when model.backbone is not none."""

    enabled: bool = True  # false: one phase, the whole backbone trainable
    head_epochs: Annotated[int, Meta(ge=0, le=10_000)] = 5  # phase 1: backbone frozen, head only
    # phase 2: the top layers of the backbone trainable: a count (int) or a fraction
    # of its layers (float in [0, 1]); BatchNormalization stays in inference mode.
    unfreeze: Annotated[int, Meta(ge=0, le=10_000)] | Annotated[float, Meta(ge=0, le=10_000)] = 0.25
    lr_factor: Annotated[float, Meta(gt=0.0, le=10.0)] = 0.1  # phase 2 learning rate = this x peak

    def _rules(self):  # a count or a fraction
        if isinstance(self.unfreeze, float) and self.unfreeze > 1.0:
            raise Rule(f"{{p}}unfreeze: {self.unfreeze} is neither a fraction in [0, 1] nor a "
                       "whole number of layers; give e.g. 0.25 or 20")


class TrainConfig(Section):
    epochs: Annotated[int, Meta(ge=1, le=10_000)] = 20
    batch_size: Annotated[int, Meta(ge=1, le=65_536)] = 64  # per replica
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    reduce_lr_on_plateau: bool = False  # only with schedule.name == constant
    early_stopping_patience: Annotated[int, Meta(ge=0, le=10_000)] = 6  # 0 turns it off
    # auto: from the hardware and the architecture (never timed); timed: the faster on
    # this machine, float32 unless bf16 is faster by more than precision_margin.
    precision: Literal["auto", "timed", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    # above the spread of two timings of one policy (benchmarks/precision.py noise)
    precision_margin: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.15
    strategy: Literal["auto", "default", "mirrored", "multi_worker"] = "auto"
    replicas: Annotated[int, Meta(ge=1, le=64)] = 1
    jit_compile: Literal["auto", "true", "false"] = "false"
    use_tuned: bool = True
    # the most val and test images listed in reports/label_issues.csv and a contact sheet:
    # only those confident learning flags as mislabelled (often fewer, possibly none);
    # 0 turns it off
    label_issues: Annotated[int, Meta(ge=0, le=10_000)] = 50
    fine_tune: FineTuneConfig = field(default_factory=FineTuneConfig)
    # Dotted keys ("optimizer.learning_rate", "model.dropout", "batch_size") that
    # win over the tune stage's best hyperparameters.
    overrides: dict[str, Any] = field(default_factory=dict)

    def _rules(self):
        # Overrides name real keys: a typo here is otherwise found only when tune's final
        # round or train merges the overrides, after the whole search.
        for key, value in self.overrides.items():
            full = override_key(key)
            tp = _overridable(full)
            if tp is None:
                raise Rule(f"{{p}}overrides: {key!r} is not a key of model or train{_near(full)}; "
                           "use dotted keys such as optimizer.learning_rate or model.dropout")
            try:
                msgspec.convert(value, tp, strict=True)
            except msgspec.ValidationError as exc:
                raise Rule(f"{{p}}overrides: {key}: {value!r} is not accepted for {full} "
                           f"({reason(exc)}); give a value {full} accepts") from None
        # plateau needs a constant schedule
        if self.reduce_lr_on_plateau and self.schedule.name != "constant":
            raise Rule(f"{{p}}reduce_lr_on_plateau: only works with {{p}}schedule.name: "
                       f"constant, not {self.schedule.name!r}")


def override_key(key: str) -> str:
    """A train.overrides key as a full dotted params key (bare keys are train's)."""
    return key if key.split(".")[0] in ("model", "train") else f"train.{key}"


def model_or_train_field(key: str):
    """The declared type of a dotted model.* or train.* params key, else None (read from the
    two sections, not Config: Config is built from this module)."""
    first, *rest = key.split(".")
    section_of = {"model": ModelSpec, "train": TrainConfig}.get(first)
    return field_info(section_of, rest) if section_of is not None else None


def _overridable(full: str):
    """The declared type of a model/train key an override may set, else None."""
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
    for f in msgspec.structs.fields(cls):
        out.append(prefix + f.name)
        if is_section(f.type):
            out += _dotted_keys(f.type, f"{prefix}{f.name}.")
    return out

