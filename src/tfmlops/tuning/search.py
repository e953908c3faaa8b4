"""The search's identity (its key and folder) and this process's role in it."""

from __future__ import annotations

import hashlib
import json
import os

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.model import hparams, search_space


def search_key(cfg: Config) -> str:
    """A hash of everything a trial's result depends on, except the budgets.

    Same key: the saved search resumes (raising max_trials or budget_minutes
    extends it). Different key: a fresh search in its own folder.
    """
    d = cfg.to_dict()
    # the settings a trial takes from params (the searched ones pinned to one point)
    probe = search_space.config_from_values(cfg, search_space.reference_values(cfg.tune.space))
    tune = {k: v for k, v in d["tune"].items()
            if k not in ("enabled", "max_trials", "budget_minutes", "final_candidates")}
    blob = {
        "seed": cfg.seed, "tune": tune, "fixed": hparams.tuned_tree(probe),
        "loss": d["train"]["loss"],
        # the pipeline's speed settings (autotune, cache) change speed, not batches
        "pipeline": cfg.pipeline.without_speed_settings(),
        "data": tracking.data_version(cfg),
    }
    text = json.dumps(blob, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def project_name(cfg: Config, key: str) -> str:
    return f"{cfg.tune.tuner}-{key}"


def distributed_role() -> str:
    """single | chief | worker, from keras-tuner's own distributed-mode variables."""
    if not os.environ.get("KERASTUNER_ORACLE_IP"):
        return "single"
    return "chief" if "chief" in os.environ.get("KERASTUNER_TUNER_ID", "") else "worker"
