"""tune: the search and its space."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, field

from tfmlops.config.messages import Rule, field_bounds
from tfmlops.config.sections.base import Section, copies
from tfmlops.config.sections.model import Backbone
from tfmlops.config.sections.train import Optimizer, Schedule, model_or_train_field


def objective_direction(objective: str) -> str:
    """"max" for an accuracy objective, "min" for a loss: the rule all of tuning follows."""
    return "max" if "accuracy" in objective else "min"


class _Range(Section):
    """A searched range, `min` to `max`: IntRange and FloatRange declare both."""

    def _rules(self):
        if self.min > self.max:
            raise Rule(f"{{path}}: min {self.min} > max {self.max}; give min <= max")


class IntRange(_Range):
    min: Annotated[int, Meta(ge=1)] = 1
    max: int = 1
    step: Annotated[int, Meta(ge=1)] = 1


class FloatRange(_Range):
    min: Annotated[float, Meta(ge=0.0)] = 0.0
    max: float = 0.0


def _nonempty(item):
    """A list of choices with at least one (a one-value list is a fixed value)."""
    return Annotated[list[item], Meta(min_length=1)]


_Filters = _nonempty(Annotated[int, Meta(ge=1, le=4096)])
_HeadUnits = _nonempty(Annotated[int, Meta(ge=1, le=8192)])
_BatchSizes = _nonempty(Annotated[int, Meta(ge=1, le=65_536)])
_Flags = _nonempty(bool)
_Optimizers = _nonempty(Optimizer)
_Schedules = _nonempty(Schedule)
_Backbones = _nonempty(Backbone)


class SearchSpace(Section):
    """What tune searches. The field names are the hyperparameter names
    (`HP_NAMES`); `SEARCHED_PARAMS` says which params key each one sets."""

    blocks: IntRange = field(default_factory=lambda: IntRange(1, 3, 1))
    filters: _Filters = copies(16, 32)  # first block; each next block doubles it
    separable: _Flags = copies(False, True)
    batch_norm: _Flags = copies(True, False)
    dropout: FloatRange = field(default_factory=lambda: FloatRange(0.0, 0.4))
    head_units: _HeadUnits = copies(64, 128)
    optimizer: _Optimizers = copies("adam", "adamw")
    learning_rate: FloatRange = field(  # sampled on a log scale
        default_factory=lambda: FloatRange(5e-4, 5e-3))
    schedule: _Schedules = copies("constant", "cosine_warmup", "exponential_decay")
    warmup_fraction: FloatRange = field(default_factory=lambda: FloatRange(0.0, 0.2))
    decay_rate: FloatRange = field(default_factory=lambda: FloatRange(0.3, 0.9))
    batch_size: _BatchSizes = copies(32, 64)
    # Transfer learning; null: not searched (params' own value). A backbone trial
    # ignores blocks/filters/separable/batch_norm.
    backbone: _Backbones | None = None
    head_epochs: IntRange | None = None
    unfreeze: FloatRange | None = None  # a fraction of the backbone's layers
    lr_factor: FloatRange | None = None  # sampled on a log scale

    def _rules(self):
        for name in HP_NAMES:  # each value once
            values = getattr(self, name)
            if isinstance(values, list):
                dupes = sorted({repr(v) for v in values if values.count(v) > 1})
                if dupes:
                    raise Rule(f"{{p}}{name}: {dupes[0]} is listed twice; list each value once")
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


HP_NAMES = SearchSpace.__struct_fields__
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


class PruningConfig(Section):
    """Early stopping of losing trials (stages/tune/pruning.py). median: a trial whose best
    objective so far is worse than the median of the trials finished before it, at the
    same epoch, stops there. halving: at rungs (warmup_epochs + 1) * factor**k, a trial
    outside the top 1/factor of the earlier trials at that rung stops. off: every trial
    runs its epochs."""

    # YAML reads a bare `off` as false: _rules turns it into "off"
    rule: Literal["median", "halving", "off"] | bool = "median"
    warmup_epochs: Annotated[int, Meta(ge=0, le=10_000)] = 1  # never judged in its first N epochs
    min_trials: Annotated[int, Meta(ge=1, le=100_000)] = 3  # earlier trials to compare with
    factor: Annotated[int, Meta(ge=2, le=100)] = 3  # halving: rung spacing and kept fraction

    def _rules(self):
        if self.rule is True:
            raise Rule("{p}rule: true is not a rule; give median, halving or off")
        if self.rule is False:
            msgspec.structs.force_setattr(self, "rule", "off")


class TuneConfig(Section):
    enabled: bool = True
    tuner: Literal["hyperband", "bayesian", "random"] = "hyperband"
    objective: Literal["val_accuracy", "val_loss"] = "val_accuracy"
    max_trials: Annotated[int, Meta(ge=1, le=100_000)] = 12
    max_epochs: Annotated[int, Meta(ge=1, le=10_000)] = 6
    budget_minutes: Annotated[float, Meta(gt=0.0, le=100_000.0)] = 30.0  # a guard, not a setting
    early_stopping_patience: Annotated[int, Meta(ge=0, le=1000)] = 2
    hyperband_factor: Annotated[int, Meta(ge=2, le=100)] = 3
    # The params' own settings and the search's best N configurations are trained at
    # train.epochs (the params' own take a place when the search ranks them in the
    # best N); the winner (ties: the params') is the tuned configuration.
    final_candidates: Annotated[int, Meta(ge=0, le=100)] = 1
    # A trial whose model has more parameters fails (recorded FAILED) and the
    # search goes on: keeps the search within an edge size budget. 0: no limit.
    max_model_params: Annotated[int, Meta(ge=0)] = 0
    pruning: PruningConfig = field(default_factory=PruningConfig)
    space: SearchSpace = field(default_factory=SearchSpace)

    @property
    def direction(self) -> str:
        return objective_direction(self.objective)

    @property
    def sign(self) -> int:
        """+1 when a higher objective is better, -1 when a lower one is."""
        return 1 if self.direction == "max" else -1
