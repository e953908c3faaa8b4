"""The keras-tuner hypermodel: a trial's model from the shared builder, trained on the
project's tf.data pipeline. Imports Keras and keras-tuner: import this module lazily."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import keras
import keras_tuner as kt

from tfmlops import profiling
from tfmlops.artifacts import PRECISION
from tfmlops.config import Config
from tfmlops.model import fitting, precision
from tfmlops.stages.tune import search_space

STAGE = "tune"  # the profile folder's name


class StopAtDeadline(keras.callbacks.Callback):
    """Ends a trial at the first epoch end past the search's wall-clock budget."""

    def __init__(self, deadline: float, on_stop):
        super().__init__()
        self.deadline, self.on_stop = deadline, on_stop

    def on_epoch_end(self, epoch, logs=None):
        if time.monotonic() > self.deadline:
            self.model.stop_training = True
            self.on_stop()


class _UntilPruned(list):
    """A trial's phases, ending after the one in which the pruner stopped the trial:
    fit_in_phases starts each next phase after an early stop (train's rule), but a
    pruned trial is over."""

    def __init__(self, phases, pruned):
        super().__init__(phases)
        self.pruned = pruned

    def __iter__(self):
        for phase in super().__iter__():
            if self.pruned():
                return
            yield phase


class TrialModel(kt.HyperModel):
    """Builds a trial's model from its values with the shared builder; trains it
    on the project's pipeline with the trial's batch size, optimizer and schedule."""

    def __init__(self, cfg: Config, prepared, deadline: float):
        super().__init__(name="tfmlops")
        self.cfg, self.prepared, self.deadline = cfg, prepared, deadline
        self.profiled_dir: Path | None = None
        self.cut_short = False  # the budget ended a trial before its epochs
        self.pruned = lambda: False  # the running trial was stopped by the pruner (tuner.py)

    def declare_hyperparameters(self, hp):
        search_space.declare(hp, self.cfg.tune.space)

    def _trial_cfg(self, hp) -> Config:
        return search_space.config_from_values(self.cfg, search_space.declare(hp, self.cfg.tune.space))

    def build(self, hp):
        trial_cfg = self._trial_cfg(hp)
        # as train resolves it (timed once, the file shared with the final round); before the seed
        policy = fitting.choose_precision(
            trial_cfg, self.prepared, trial_cfg.train.batch_size,
            cache_file=Path(self.cfg.paths.tuner) / PRECISION).policy
        keras.utils.set_random_seed(self.cfg.seed)  # same values, same initial weights
        with precision.global_policy(policy, keras):  # read when the layers are created
            return fitting.built_model(trial_cfg, self.prepared, keras)

    def fit(self, hp, model, *args, epochs=1, initial_epoch=0, callbacks=(), verbose=2,
            **kwargs):
        trial_cfg = self._trial_cfg(hp)
        # Datasets of its own, as train builds them: a trial draws the same batches whatever
        # ran before it. A dataset shared across trials reshuffles on from the epochs earlier
        # trials drew, so a pruned or resumed search fed a later trial other batches than a
        # cold, unpruned one, and scored it differently.
        data = fitting.datasets(self.cfg, self.prepared, trial_cfg.train.batch_size)
        extra = self._callbacks(data[2])
        # train's fine-tuning phases over this fit's epochs (none without a backbone). Each
        # phase compiles a fresh optimizer whose schedule spans the epochs it runs (a
        # hyperband round that continues an earlier trial starts one too).
        plan = _UntilPruned([dataclasses.replace(p, first=max(p.first, initial_epoch))
                             for p in fitting.phases(trial_cfg, epochs)], self.pruned)
        # the tuner scores the trial on every epoch of both phases: the History holds them all
        return fitting.fit_in_phases(model, trial_cfg, self.prepared, keras, data, plan,
                                 lambda phase: [*callbacks, *extra], verbose, done=initial_epoch)

    def _callbacks(self, steps: int) -> list:
        """NaN and deadline stops, early stopping, and a profile of the first trial run."""
        extra = [keras.callbacks.TerminateOnNaN(),
                 StopAtDeadline(self.deadline, lambda: setattr(self, "cut_short", True))]
        t = self.cfg.tune
        if t.early_stopping_patience:
            extra.append(keras.callbacks.EarlyStopping(
                monitor=t.objective, patience=t.early_stopping_patience, mode=t.direction))
        if self.cfg.profiling.enabled and self.profiled_dir is None:
            self.profiled_dir = profiling.fresh_profile_dir(self.cfg, STAGE)
            extra.append(keras.callbacks.TensorBoard(
                log_dir=str(self.profiled_dir), write_graph=False, histogram_freq=0,
                profile_batch=profiling.keras_profile_batch(self.cfg, steps)))
        return extra
