"""The tune stage's search space, defined next to the model spec it fills in: one
keras-tuner hyperparameter per key of `tune.space` (params.yaml), and the Config a
trial's values choose (for the best trial, what `best_hparams.yaml` holds):

- architecture: `blocks` conv blocks, the first `filters` wide and each next one
  twice as wide (the usual CNN shape, as in the default 32 -> 64 spec),
  `separable` or standard convolutions, `batch_norm`, `dropout`, `head_units`;
- optimisation: `optimizer`, peak `learning_rate` (log scale), `schedule` and
  its own parameters (`warmup_fraction` only for cosine_warmup, `decay_rate`
  only for exponential_decay: conditional hyperparameters), `batch_size`;
- transfer learning, only when given (null: not searched, the params' value):
  `backbone` (a backbone trial ignores the conv blocks), and train.fine_tune's
  `head_epochs`, `unfreeze` (a fraction of the backbone's layers), `lr_factor`.

Everything not searched (kernel size, convs per block, pooling, activation,
weight decay, the loss...) comes from params.yaml. A range whose min equals its
max, or a one-value list, is a fixed value. No TensorFlow import here: the
keras-tuner `hp` object is passed in.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from tfmlops.config import (
    HP_NAMES,
    SEARCHED_PARAMS,
    Config,
    FloatRange,
    IntRange,
    SearchSpace,
    config_from_dict,
)
from tfmlops.config.sections.root import MAX_FILTERS, search_space_problem
from tfmlops.errors import ConfigError

# HP_NAMES (the SearchSpace fields, in order) is also the column order of
# reports/tune_trials.csv and of the MLflow params of a trial.
__all__ = ["HP_NAMES", "MAX_FILTERS", "OPTIONAL", "baseline", "check_fits", "config_from_values", "declare",
           "is_baseline", "outside_space", "reference_values", "values_from_config"]
# Schedule parameters and the one schedule that uses each.
SCHEDULE_PARAMS = {"warmup_fraction": "cosine_warmup", "decay_rate": "exponential_decay"}
LOG_SCALE = ("learning_rate", "lr_factor")  # sampled on a log scale
# Searched only when tune.space gives them (null by default: the params' value).
OPTIONAL = ("backbone", "head_epochs", "unfreeze", "lr_factor")
# Declared unconditionally, in HP_NAMES order (keras-tuner's space order).
ALWAYS = tuple(n for n in HP_NAMES if n not in SCHEDULE_PARAMS)
# Where each searched value lives in params.yaml (for messages). The first
# three together shape model.blocks; every other one sets one key.
PARAMS_KEYS = {
    "blocks": "model.blocks (count)", "filters": "model.blocks[0].filters",
    "separable": "model.blocks[].separable", **SEARCHED_PARAMS,
}


def declare(hp, space: SearchSpace) -> dict[str, Any]:
    """Declare the space on keras-tuner's `hp`; return this trial's active values."""
    values = {name: _declare_one(hp, name, getattr(space, name)) for name in ALWAYS}
    for name, schedule in SCHEDULE_PARAMS.items():
        if schedule in space.schedule:  # else it never matters: not searched
            with hp.conditional_scope("schedule", [schedule]):
                values[name] = _declare_one(hp, name, getattr(space, name))
    return {k: v for k, v in values.items() if v is not None}  # None: inactive


def config_from_values(cfg: Config, values: dict[str, Any]) -> Config:
    """`cfg` with the model and train settings a trial's values choose.

    Keys of `values` that are not search-space names (keras-tuner's own
    `tuner/epochs` and so on) are ignored; missing ones keep the params' value.
    """
    tree = cfg.to_dict()
    model = tree["model"]
    if "blocks" in values or "filters" in values or "separable" in values:
        first = model["blocks"][0] if model["blocks"] else {"filters": 32, "kernel_size": 3,
                                                            "separable": False}
        count = int(values.get("blocks", len(model["blocks"]) or 1))
        base = int(values.get("filters", first["filters"]))
        separable = bool(values.get("separable", first["separable"]))
        model["blocks"] = [{"filters": base * 2**i, "kernel_size": first["kernel_size"],
                             "separable": separable} for i in range(count)]
    for name, key in SEARCHED_PARAMS.items():
        if name in values:
            *sections, last = key.split(".")
            node = functools.reduce(dict.__getitem__, sections, tree)
            # unfreeze is a count (int) or a fraction (float): the space searches fractions
            kind = float if name == "unfreeze" else type(node[last])
            # keras-tuner gives numpy scalars, and 0/1 for booleans
            node[last] = kind(values[name]) if kind in (bool, int, float) else values[name]
    return config_from_dict(copy.deepcopy(tree))


def values_from_config(cfg: Config) -> dict[str, Any]:
    """The search-space values of `cfg`'s own settings: the inverse of `config_from_values`.

    Like `declare`, it gives only the active values: a schedule parameter only
    for its own schedule. Raises ValueError when `cfg.model.blocks` is not a
    shape the space describes (the first block's width doubling block after
    block, one kernel size, one convolution type).
    """
    m = cfg.model
    if not m.blocks:
        raise ValueError("model.blocks is empty; the search space has at least one block")
    first = m.blocks[0]
    # Tuples, not BlockSpecs: a doubled width past BlockSpec's bound is simply not this shape.
    doubling = [(first.filters * 2**i, first.kernel_size, first.separable)
                for i in range(len(m.blocks))]
    if [(b.filters, b.kernel_size, b.separable) for b in m.blocks] != doubling:
        raise ValueError("model.blocks do not double in width from the first block with one "
                         "kernel size and one convolution type, the shape tune searches")
    shape = {"blocks": len(m.blocks), "filters": first.filters, "separable": first.separable}
    values = {name: shape[name] if name in shape else _at(cfg, SEARCHED_PARAMS[name])
              for name in ALWAYS if getattr(cfg.tune.space, name) is not None}
    for name, schedule in SCHEDULE_PARAMS.items():
        if cfg.train.schedule.name == schedule:
            values[name] = _at(cfg, SEARCHED_PARAMS[name])
    return values


def outside_space(values: dict[str, Any], space: SearchSpace) -> str | None:
    """The first of `values` that lies outside `space`, as one line naming its key."""
    for name in HP_NAMES:
        allowed = getattr(space, name)
        if name not in values or allowed is None:  # None: not searched
            continue
        value = values[name]
        if isinstance(allowed, IntRange):
            inside = (allowed.min <= value <= allowed.max
                      and (value - allowed.min) % allowed.step == 0)
            shown = f"{allowed.min}..{allowed.max} step {allowed.step}"
        elif isinstance(allowed, FloatRange):
            inside = allowed.min <= value <= allowed.max
            shown = f"[{allowed.min:g}, {allowed.max:g}]"
        else:
            inside = value in allowed
            shown = str(list(allowed))
        if not inside:
            return f"{PARAMS_KEYS[name]} {value!r} is outside tune.space.{name} {shown}"
    return None


def baseline(cfg: Config) -> tuple[dict[str, Any] | None, str | None]:
    """(the params' own values, None) when they all lie in `tune.space`, else
    (None, one line saying which key does not)."""
    try:
        values = values_from_config(cfg)
    except ValueError as exc:
        return None, str(exc)
    why = outside_space(values, cfg.tune.space)
    return (None, why) if why else (values, None)


def is_baseline(trial_id: str, values: dict[str, Any], base: dict[str, Any] | None) -> bool:
    """Whether a trial is the baseline: the search's first trial, holding `base`."""
    if base is None or int(trial_id) != 0:
        return False
    return {k: values[k] for k in HP_NAMES if k in values} == base


def reference_values(space: SearchSpace) -> dict[str, Any]:
    """One fixed point of the space (each range's min, each list's first value).

    `config_from_values(cfg, reference_values(space))` differs between two
    configs with the same space only in settings that are not searched: what
    tune's search key hashes besides the space itself.
    """
    values = {name: (r.min if isinstance(r, (IntRange, FloatRange)) else r[0])
              for name in ALWAYS for r in [getattr(space, name)] if r is not None}
    for name, schedule in SCHEDULE_PARAMS.items():
        if schedule in space.schedule:
            values[name] = getattr(space, name).min
    return values


def check_fits(space: SearchSpace, image_size: int) -> None:
    """Fail before any work if the largest architecture in the space cannot be built."""
    problem = search_space_problem(space, image_size)
    if problem:
        raise ConfigError(problem)


# ------------------------------------------------------------------ helpers

def _declare_one(hp, name: str, allowed):
    """One hyperparameter on `hp`: a range whose min is its max, or a one-value list, is fixed."""
    if allowed is None:  # an optional key left out of tune.space: the params' value
        return None
    if isinstance(allowed, IntRange):
        if allowed.min == allowed.max:
            return hp.Fixed(name, allowed.min)
        return hp.Int(name, allowed.min, allowed.max, step=allowed.step)
    if isinstance(allowed, FloatRange):
        if allowed.min == allowed.max:
            return hp.Fixed(name, float(allowed.min))
        return hp.Float(name, allowed.min, allowed.max,
                        sampling="log" if name in LOG_SCALE else "linear")
    distinct = list(dict.fromkeys(allowed))
    if len(distinct) == 1:
        return hp.Fixed(name, distinct[0])
    if all(isinstance(v, bool) for v in distinct):
        # keras-tuner's Choice turns booleans into 0/1 (bool is an int): use Boolean
        return hp.Boolean(name, default=distinct[0])
    return hp.Choice(name, distinct)


def _at(cfg: Config, dotted: str):
    """The value of a dotted params key in `cfg`."""
    return functools.reduce(getattr, dotted.split("."), cfg)

