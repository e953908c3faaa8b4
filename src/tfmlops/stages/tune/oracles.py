"""keras-tuner oracles with a wall-clock budget and the params' own settings as the
first trial of a fresh search. Imports keras-tuner: import this module lazily.

The mixins override `populate_space` and the private `_random_values` (keras-tuner 1.4.8).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import keras_tuner as kt

from tfmlops.config import Config
from tfmlops.stages.tune import search_space

log = logging.getLogger(__name__)

# The search stops early if this many trials fail in a row before any succeeds
# (a broken setup would otherwise burn the whole budget); after one success,
# failures are recorded and the search goes on.
MAX_FAILURES_BEFORE_SUCCESS = 3


class BudgetMixin:
    """Stops handing out trials once the wall-clock budget is spent (after at
    least one success), or after repeated failures with no success at all."""

    deadline: float | None = None
    stop_reason: str | None = None

    def populate_space(self, trial_id):
        done = [self.trials[i] for i in self.end_order if i in self.trials]
        succeeded = any(t.status == "COMPLETED" for t in done)
        if succeeded and self.deadline is not None and time.monotonic() > self.deadline:
            self.stop_reason = "budget"
        elif not succeeded and len(done) >= MAX_FAILURES_BEFORE_SUCCESS and all(
                t.status == "FAILED" for t in done[-MAX_FAILURES_BEFORE_SUCCESS:]):
            self.stop_reason = "failures"
        if self.stop_reason:
            return {"status": "STOPPED", "values": None}
        return super().populate_space(trial_id)


class BaselineMixin:
    """The first values a fresh search asks for are the params' own (`baseline`).

    `_random_values` is where all three oracles draw a new point: random
    search every trial, hyperband the first round of a bracket, bayesian
    its initial points. A search with trials (resumed, reloaded) draws at
    random as before; the baseline uses no seed state, so the random
    trials after it are the same for the same seed.
    """

    baseline: dict[str, Any] | None = None
    baseline_skipped: str | None = None  # why there is no baseline

    def _random_values(self):
        if self.trials:
            return super()._random_values()
        values = self._baseline_values()
        if values is None:
            log.info(f"tune: no baseline trial: {self.baseline_skipped}")
            return super()._random_values()
        log.info("tune: trial 0 is the baseline: the params' own settings")
        return values

    def _baseline_values(self):
        if self.baseline is None:
            return None
        hps = kt.HyperParameters()
        for hp in self.hyperparameters.space:  # only the active ones, as keras-tuner
            hps.merge([hp])
            if hps.is_active(hp):
                hps.values[hp.name] = self.baseline.get(hp.name)
        if set(hps.values) != set(self.baseline):  # a space declared otherwise
            self.baseline_skipped = (f"the search space declares {sorted(hps.values)}, "
                                     f"the params give {sorted(self.baseline)}")
            return None
        return dict(hps.values)


class HyperbandOracle(BudgetMixin, BaselineMixin, kt.oracles.HyperbandOracle):
    pass


class BayesianOracle(BudgetMixin, BaselineMixin, kt.oracles.BayesianOptimizationOracle):
    pass


class RandomOracle(BudgetMixin, BaselineMixin, kt.oracles.RandomSearchOracle):
    pass


def make_oracle(cfg: Config):
    """The keras-tuner oracle for `tune.tuner`, seeded, with our budget stop and
    the params' own settings as the first trial of a fresh search."""
    t = cfg.tune
    common = {
        "objective": kt.Objective(t.objective, t.direction),
        # keras-tuner replaces a seed of 0 by a random one: shift to keep 0 reproducible
        "seed": cfg.seed + 1,
        "max_retries_per_trial": 0,
        # keras-tuner raises (losing the trial's state) after N failures in a row;
        # BudgetMixin stops the search cleanly instead.
        "max_consecutive_failed_trials": 1_000_000,
    }
    if t.tuner == "hyperband":
        oracle = HyperbandOracle(max_epochs=t.max_epochs, factor=t.hyperband_factor,
                                 hyperband_iterations=1, **common)
        oracle.max_trials = t.max_trials  # hyperband has no trial cap of its own
    elif t.tuner == "bayesian":
        # keras-tuner's default (3 x dimensions random points) would make a
        # 12-trial search purely random
        oracle = BayesianOracle(max_trials=t.max_trials,
                                num_initial_points=max(3, t.max_trials // 3), **common)
    else:
        oracle = RandomOracle(max_trials=t.max_trials, **common)
    oracle.baseline, oracle.baseline_skipped = search_space.baseline(cfg)
    return oracle
