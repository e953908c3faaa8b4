"""How tune's best hyperparameters and train's explicit overrides become one config.

`best_hparams.yaml` (written by tune) is a partial params tree with the
sections `model` and `train` (batch_size, optimizer, schedule, fine_tune). Train merges:
params.yaml <- tuned values (when train.use_tuned) <- train.overrides.
The merge is returned as a list of changes so the train run can log it.

Beside it, `searched_params.json` holds what the search read (every param a trial or
the final round depends on, and the prepared data's version): train refuses a search
result whose inputs changed since, as it refuses stale prepared data.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from tfmlops.artifacts import BEST_HPARAMS, SEARCHED, require
from tfmlops.config import Config, config_from_dict, flatten, set_dotted
from tfmlops.config.sections.train import override_key
from tfmlops.errors import ConfigError, DataError

TUNABLE_TRAIN_KEYS = ("batch_size", "optimizer", "schedule", "fine_tune")
# Not inputs of the search's result: a guard (the budget binds only when it cuts a search
# short, which the search reports), how train places and runs what it trains, and what it
# reports after.
NOT_SEARCH_INPUTS = ("tune.budget_minutes", "train.use_tuned", "train.strategy", "train.replicas",
                     "train.label_issues")
DATA_KEY = "prepared data (version)"


def best_path(cfg: Config) -> Path:
    return Path(cfg.paths.tuned) / BEST_HPARAMS


def tuned_tree(cfg: Config) -> dict[str, Any]:
    """The part of `cfg` tune searches over, as written to best_hparams.yaml."""
    d = cfg.to_dict()
    return {"model": d["model"], "train": {k: d["train"][k] for k in TUNABLE_TRAIN_KEYS}}


def read_best(cfg: Config) -> dict[str, Any]:
    path = require(best_path(cfg), "tune", hint=" (tune.enabled: false skips the search)")
    data = yaml.safe_load(path.read_text()) or {}
    return {k: data[k] for k in ("model", "train") if k in data}


def searched_params(cfg: Config, data_version: str) -> dict[str, Any]:
    """What the search's result depends on, flat (dotted keys) and JSON-normal."""
    d = cfg.to_dict()
    tree = {"seed": d["seed"], "model": d["model"], "tune": d["tune"], "train": d["train"],
            "pipeline": cfg.pipeline.without_speed_settings()}
    flat = {k: v for k, v in flatten(tree).items()
            if not any(k == n or k.startswith(n + ".") for n in NOT_SEARCH_INPUTS)}
    flat[DATA_KEY] = data_version
    return json.loads(json.dumps(flat, default=str))


def write_searched(cfg: Config, folder: str | Path, data_version: str) -> None:
    from tfmlops.files import write_json

    write_json(Path(folder) / SEARCHED, searched_params(cfg, data_version))


def check_fresh(cfg: Config, data_version: str) -> None:
    """Refuse tune's result when what it was searched with differs from the params now."""
    path = Path(cfg.paths.tuned) / SEARCHED
    rerun = "run `dvc repro tune` (or set train.use_tuned: false)"
    try:
        then = json.loads(path.read_text())
    except (OSError, ValueError):
        raise DataError(f"{best_path(cfg)} has no readable record of the params it was searched "
                        f"with ({path}); {rerun}") from None
    now = searched_params(cfg, data_version)
    if data_version == "none":  # no prepared data: train says so next, in its own words
        now[DATA_KEY] = then.get(DATA_KEY)
    changed = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k} ({then.get(k)!r} -> {now.get(k)!r})" for k in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise DataError(f"{best_path(cfg)} is stale: changed since the search: {shown}{more}; "
                        f"{rerun}")


def merge(cfg: Config, tuned: dict[str, Any] | None) -> tuple[Config, list[dict[str, Any]]]:
    """params <- tuned <- train.overrides; returns the merged config and what changed."""
    tree = cfg.to_dict()
    before = flatten(tree)
    changes: list[dict[str, Any]] = []
    if tuned and cfg.train.use_tuned:
        for key, value in flatten(tuned).items():
            untuned = key.startswith("train.") and key.split(".")[1] not in TUNABLE_TRAIN_KEYS
            if not untuned and not key.startswith("model.blocks."):  # list items: set whole below
                set_dotted(tree, key, copy.deepcopy(value))
        # blocks is a list: replace it whole rather than key by key
        if "model" in tuned and "blocks" in tuned["model"]:
            tree["model"]["blocks"] = copy.deepcopy(tuned["model"]["blocks"])
    overridden = [override_key(key) for key in cfg.train.overrides]  # a bare key is train's
    for key, value in zip(overridden, cfg.train.overrides.values(), strict=True):
        set_dotted(tree, key, value)
    try:
        merged = config_from_dict(tree)
    except ConfigError as exc:
        raise ConfigError(f"train.overrides / best_hparams.yaml: {exc}") from None
    after = flatten(merged.to_dict())
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            by_override = any(key == k or key.startswith(k + ".") for k in overridden)
            changes.append({"key": key, "params": before.get(key), "used": after.get(key),
                            "source": "override" if by_override else "tune"})
    return merged, changes
