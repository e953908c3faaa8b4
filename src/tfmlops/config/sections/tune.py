"""tune: the search and its space."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tfmlops.config.messages import Rule, field_bounds
from tfmlops.config.sections.base import Bool, Float, Int, copies, section
from tfmlops.config.sections.model import Backbone
from tfmlops.config.sections.train import Optimizer, Schedule, model_or_train_field


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
    filters: _Filters = copies(16, 32)  # first block; each next block doubles it
    separable: _Flags = copies(False, True)
    batch_norm: _Flags = copies(True, False)
    dropout: FloatRange = Field(default_factory=lambda: FloatRange(0.0, 0.4))
    head_units: _HeadUnits = copies(64, 128)
    optimizer: _Optimizers = copies("adam", "adamw")
    learning_rate: FloatRange = Field(  # sampled on a log scale
        default_factory=lambda: FloatRange(5e-4, 5e-3))
    schedule: _Schedules = copies("constant", "cosine_warmup", "exponential_decay")
    warmup_fraction: FloatRange = Field(default_factory=lambda: FloatRange(0.0, 0.2))
    decay_rate: FloatRange = Field(default_factory=lambda: FloatRange(0.3, 0.9))
    batch_size: _BatchSizes = copies(32, 64)
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
            low, high, open_low, _ = field_bounds(model_or_train_field(key))
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
