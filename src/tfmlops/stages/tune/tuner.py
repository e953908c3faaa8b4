"""The tuner: one construction for a single process, a distributed chief and a worker;
a nested MLflow run per trial. Imports keras-tuner: import this module lazily.

`TrackedTuner` overrides keras-tuner 1.4.8's `run_trial`, the private
`_build_hypermodel` and `_get_checkpoint_fname` use, and the trial hooks; its
`on_epoch_end` (called by keras-tuner's own Keras callback) feeds the pruner (pruning.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import keras_tuner as kt

from tfmlops import faults, tracking
from tfmlops.config import Config
from tfmlops.files import write_json
from tfmlops.stages.tune import pruning, search_space
from tfmlops.stages.tune.hypermodel import TrialModel
from tfmlops.stages.tune.oracles import make_oracle
from tfmlops.stages.tune.search import (
    ENDED,
    TRIAL_FILE,
    SearchResult,
    adopt_search,
    best_epoch,
    distributed_role,
    last_line,
    project_name,
    record,
)

log = logging.getLogger(__name__)


class TrackedTuner(kt.Tuner):
    """One tuner for the three oracles: runs hyperband's continued rounds and
    opens one nested MLflow run per trial."""

    def __init__(self, *args, parent: tracking.StageRun, baseline: dict | None, **kwargs):
        self.parent = parent
        self.baseline = baseline  # the params' own values (None: not searched)
        self.ran_now: list[str] = []
        self.pruner = pruning.Pruner("off", 0, 1, 1)  # build_tuner sets the search's
        self._last_epoch = 0  # the running fit's epochs
        self._child: tracking.StageRun | None = None
        self._started = 0.0
        super().__init__(*args, **kwargs)

    # hyperband: epochs of this round, continuing from an earlier trial's weights
    def run_trial(self, trial, *fit_args, **fit_kwargs):
        values = trial.hyperparameters.values
        if "tuner/epochs" in values:
            fit_kwargs["epochs"] = values["tuner/epochs"]
            fit_kwargs["initial_epoch"] = values["tuner/initial_epoch"]
        self._last_epoch = fit_kwargs.get("epochs", 1)
        return super().run_trial(trial, *fit_args, **fit_kwargs)

    def _build_hypermodel(self, hp):
        model = super()._build_hypermodel(hp)
        if "tuner/trial_id" in hp.values:
            model.load_weights(self._get_checkpoint_fname(hp.values["tuner/trial_id"]))
        return model

    # MLflow: one child run per trial
    def on_trial_begin(self, trial):
        super().on_trial_begin(trial)
        self._started = time.perf_counter()
        # compared only with trials that completed before this one started (a rerun of a
        # trial a kill interrupted is not among them); a worker's oracle client has no trials
        values = trial.hyperparameters.values
        self.pruner.begin([i for i in self.oracle.end_order if i != trial.trial_id
                           and self.oracle.trials[i].status == "COMPLETED"]
                          if self.pruner.enabled else [],
                          continued=values.get("tuner/initial_epoch", 0) > 0)
        baseline = search_space.is_baseline(trial.trial_id, values, self.baseline)
        self._child = self.parent.start_child(
            f"trial-{trial.trial_id}",
            tags={"tfmlops.tune.trial": trial.trial_id, "tfmlops.tune.tuner_id": self.tuner_id,
                  "tfmlops.tune.baseline": str(baseline).lower()})
        self._child.log_params(dict(values))

    def on_epoch_end(self, trial, model, epoch, logs=None):
        logs = dict(logs or {})
        if self._child is not None:
            self._child.log_metrics(logs, step=epoch)
        if self.pruner.observe(epoch, logs.get(self.oracle.objective.name), self._last_epoch):
            model.stop_training = True

    def on_trial_end(self, trial):
        try:
            # saved before the oracle ends the trial (pruning.py: what survives a kill)
            self.pruner.end(trial.trial_id, trial.status == "COMPLETED")
            super().on_trial_end(trial)  # the oracle records the result and status
        finally:
            self._finish_child(trial)
        faults.point("tune.trial_end")  # a test kills the search here (`tune.trial_end@2`)

    def _finish_child(self, trial):
        child, self._child = self._child, None
        if child is None:
            return
        ended = self.oracle.get_trial(trial.trial_id)
        seconds = time.perf_counter() - self._started
        status = "FINISHED" if ended.status == "COMPLETED" else "FAILED"
        child.set_tags({"tfmlops.tune.status": ended.status})
        if ended.message:
            child.set_tags({"tfmlops.tune.error": last_line(ended.message)})
        if ended.score is not None and status == "FINISHED":
            child.log_metrics({"score": ended.score, "best_epoch": best_epoch(ended)})
        child.log_metrics({"seconds": seconds})
        stopped = self.pruner.stopped_at_epoch
        if stopped is not None:
            child.log_metrics({"stopped_at_epoch": stopped})
            child.set_tags({"tfmlops.tune.stopped_at_epoch": str(stopped)})
        child.end(status)
        self.ran_now.append(trial.trial_id)
        side = {"seconds": round(seconds, 2), "run_id": child.run_id, "tuner_id": self.tuner_id,
                "stopped_at_epoch": stopped}
        write_json(Path(self.get_trial_dir(trial.trial_id)) / TRIAL_FILE, side)

    def close_open_trial(self):
        """End the child run of a trial interrupted by an exception or a kill."""
        if self._child is not None:
            self._child.end("KILLED")
            self._child = None


def build_tuner(cfg: Config, parent: tracking.StageRun, key: str):
    """(tuner, oracle) of search `key`, the same in every role. On a distributed
    worker keras-tuner wraps the oracle in a client of the chief's."""
    from tfmlops.data import pipeline

    prepared = pipeline.load_prepared(cfg)
    deadline = time.monotonic() + cfg.tune.budget_minutes * 60
    oracle = make_oracle(cfg)
    tuner = TrackedTuner(oracle=oracle, hypermodel=TrialModel(cfg, prepared, deadline),
                         parent=parent, baseline=oracle.baseline, directory=str(cfg.paths.tuner),
                         project_name=project_name(cfg, key), overwrite=False,
                         max_model_size=cfg.tune.max_model_params or None)
    oracle.deadline = deadline
    tuner.pruner = _pruner(cfg, tuner.project_dir)
    tuner.hypermodel.pruned = lambda: tuner.pruner.stopped_at_epoch is not None
    return tuner, oracle


def _pruner(cfg: Config, project_dir: str) -> pruning.Pruner:
    """The search's pruner: off in a distributed search, whose trials end in arrival
    order (which trials a trial is compared with would depend on the workers' speed)."""
    single = distributed_role() == "single"
    if not single and cfg.tune.pruning.rule != "off":
        log.info("tune: tune.pruning is off in a distributed search (trials end in arrival "
                 "order: which ones a trial is compared with would not be reproducible)")
    return pruning.load(cfg.tune.pruning, cfg.tune.sign, Path(project_dir), enabled=single)


def _search(tuner: TrackedTuner, cfg: Config) -> None:
    from tfmlops.model.fitting import op_determinism
    from tfmlops.progress import keras_verbose

    try:
        # as train and the final round: with the seeds, the same trials give the same scores
        with op_determinism(cfg.pipeline.deterministic):
            tuner.search(epochs=cfg.tune.max_epochs, verbose=keras_verbose())
    finally:
        tuner.close_open_trial()


def search(cfg: Config, parent: tracking.StageRun, key: str) -> SearchResult:
    """Run (or resume) the search (single process or chief); every trial of it, old and new."""
    adopt_search(cfg, key)  # a search a kill left damaged starts afresh
    tuner, oracle = build_tuner(cfg, parent, key)
    ended_before = {i for i, t in oracle.trials.items() if t.status in ENDED}
    log.info(f"tune: {cfg.tune.tuner} search in {tuner.project_dir} "
             f"({len(ended_before)} trials finished before, "
             f"budget {cfg.tune.budget_minutes:g} min)")
    started = time.perf_counter()
    _search(tuner, cfg)
    seconds = time.perf_counter() - started
    in_trial_order = sorted(oracle.trials.values(), key=lambda t: (int(t.trial_id), t.trial_id))
    stopped = pruning.stopped_at(tuner.project_dir)
    trials = [record(tuner.project_dir, t, oracle.baseline, stopped.get(t.trial_id))
              for t in in_trial_order]
    # ended now, by this process or (on a chief) by any worker
    ran_now = [t.trial_id for t in trials
               if t.status in ENDED and t.trial_id not in ended_before]
    stop = oracle.stop_reason or ("budget" if tuner.hypermodel.cut_short else "done")
    return SearchResult(trials, ran_now, seconds, stop, tuner.hypermodel.profiled_dir)


def work(cfg: Config, parent: tracking.StageRun, key: str) -> dict:
    """A distributed worker: run the chief's trials, nested under the chief's run."""
    tuner, _ = build_tuner(cfg, parent, key)
    _search(tuner, cfg)
    return {"role": "worker", "tuner_id": tuner.tuner_id, "trials_run": len(tuner.ran_now)}
