"""Stage `tune`: a keras-tuner search over architectures and learning-rate schedules.

Output: `paths.tuned/best_hparams.yaml` (the contract of model/hparams.py: a
partial params tree that `train` merges), `final_round.csv` and `mlflow_run.json`, swapped in
whole; `reports/tune.json` (metrics) and `reports/tune_trials.csv` (one row per
trial). With `tune.enabled: false` the file holds the params' own settings.

The search: hyperband (default), bayesian or random over the space of
`model/search_space.py`, every trial built by the shared builder and fed by the
project's tf.data pipeline, with early stopping. Budgets: `max_trials` (any
tuner), `max_epochs` per trial, and `budget_minutes` of wall clock, after which
the running trial stops at its epoch's end, no new trial starts, and the best
so far is kept. keras-tuner's state lives in `paths.tuner/<tuner>-<key>`, the
key hashing everything a trial depends on (space, tuner, seed, fixed settings,
data version): rerunning resumes a killed or budget-stopped search without
redoing finished trials; changing the space starts a fresh one.

Baseline: the first trial of a fresh search (any tuner, distributed too) is
the params' own model and optimizer settings when they all lie in the space
(else one line says which key does not), so the search's best scores at least
what the params' own settings score in it. Its child run is tagged
`tfmlops.tune.baseline=true`; the trials CSV has a `baseline` column.

Final round (`tune.final_candidates`, model/final_round.py): the params' own
settings and the search's best trials are trained exactly as `train` trains
them; a challenger must beat the params' settings to become the tuned
configuration.

MLflow: the stage's run is the parent; each trial is a nested child run with
its hyperparameters as params, per-epoch metrics, and status FAILED when the
trial failed (the search goes on). The parent logs the best values and score,
the trials CSV, plots, and a TensorFlow Profiler trace of the first trial run.

Distributed search (keras-tuner's own mode, KERASTUNER_TUNER_ID /
KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT): the chief ("chief" in the
tuner id) serves the oracle, owns the parent run (tagged with the search key)
and writes every output; each worker finds that open run by its tags
(tracking.attach_run) and nests its trials under it, writing no output.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.files import staging_dir, swap_in, write_csv, write_json, write_text
from tfmlops.model import final_round, hparams, search_space

STAGE = "tune"
TRIAL_FILE = "tfmlops_trial.json"  # beside keras-tuner's trial.json: seconds, child run id
# The search stops early if this many trials fail in a row before any succeeds
# (a broken setup would otherwise burn the whole budget); after one success,
# failures are recorded and the search goes on.
MAX_FAILURES_BEFORE_SUCCESS = 3
WORKER_WAIT_S = 120.0  # how long a worker waits for the chief's parent run
ENDED = ("COMPLETED", "FAILED", "INVALID")  # keras-tuner trial statuses of a finished trial
FIXED_COLUMNS = ("trial", "baseline", "score", "status", "epochs", "best_epoch", "seconds")


def run(cfg: Config) -> dict[str, Any]:
    search_space.check_fits(cfg.tune.space, cfg.data.image_size)
    if not cfg.tune.enabled:
        return _write_untuned(cfg)
    role = distributed_role()
    if role == "worker":
        return _run_worker(cfg)

    out = staging_dir(cfg.paths.tuned)
    key = search_key(cfg)
    with tracking.stage_run(cfg, STAGE, out, upstream={"prepare": cfg.paths.prepared},
                            params=_params(cfg)) as parent:
        parent.set_tags({"tfmlops.tune.search": key, "tfmlops.tune.role": role,
                         "tfmlops.tune.tuner": cfg.tune.tuner})
        result = _search(cfg, parent, key)
        best = _best_trial(cfg, result.trials)
        final = final_round.run(cfg, parent, result.trials, best)
        winner = final_round.pick_winner(cfg, final) if final else None
        best_cfg = winner.config if winner else search_space.config_from_values(cfg, best.values)
        rows = _rows(cfg, result.trials)
        write_csv(_csv_path(cfg), rows, _columns())
        write_text(out / hparams.BEST_FILE, _best_text(cfg, best, key, best_cfg, winner))
        metrics = {**_metrics(cfg, result, best), **final_round.metrics(final, winner)}
        if final:
            write_csv(out / final_round.FILE, final_round.rows(final), final_round.COLUMNS)

        parent.log_params({"best": {k: best.values[k] for k in search_space.HP_NAMES
                                    if k in best.values}})
        parent.log_metrics(metrics)
        parent.set_tags({"tfmlops.tune.best_trial": best.trial_id,
                         **({"tfmlops.tune.best_run": best.run_id} if best.run_id else {}),
                         **({"tfmlops.tune.winner": winner.name} if winner else {})})
        parent.log_artifact(_csv_path(cfg), "tune")
        _log_plots(parent, cfg, rows)
        if result.profile_dir is not None:
            parent.log_artifact(result.profile_dir, "profile")
        final_dir = swap_in(out, cfg.paths.tuned)
        parent.log_artifact(hparams.best_path(cfg), "tune")
        if final:
            parent.log_artifact(final_dir / final_round.FILE, "tune")
    write_json(_report_path(cfg), metrics)
    chosen = (f"; final round at train's length: {winner.name} wins with "
              f"{cfg.tune.objective} {winner.score:.4f}" if winner else "")
    print(f"tune: best {cfg.tune.objective} {best.score:.4f} (trial {best.trial_id}) of "
          f"{metrics['trials']} trials ({metrics['trials_failed']} failed, "
          f"{metrics['trials_run']} run now) in {metrics['search_seconds']:.0f} s{chosen} -> "
          f"{hparams.best_path(cfg)}: {len(best_cfg.model.blocks)} blocks, "
          f"{best_cfg.train.optimizer.name} lr {best_cfg.train.optimizer.learning_rate:.2g}, "
          f"{best_cfg.train.schedule.name}, batch {best_cfg.train.batch_size}")
    return metrics


# ------------------------------------------------------------- the search

@dataclass
class TrialRecord:
    """One trial as the reports see it (from keras-tuner's oracle + our side file)."""

    trial_id: str
    status: str  # COMPLETED | FAILED | INVALID | RUNNING (killed before it ended)
    score: float | None
    best_epoch: int | None
    values: dict[str, Any]
    seconds: float | None = None
    run_id: str | None = None
    message: str | None = None
    baseline: bool = False  # the params' own settings (the search's first trial)


@dataclass
class SearchResult:
    trials: list[TrialRecord]
    ran_now: list[str]
    seconds: float
    stop_reason: str  # done | budget | failures
    profile_dir: Path | None = None


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
        # pipeline.autotune changes speed, not batches: not part of the key
        "loss": d["train"]["loss"],
        "pipeline": {k: v for k, v in d["pipeline"].items() if k != "autotune"},
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


def _search(cfg: Config, parent: tracking.StageRun, key: str) -> SearchResult:
    """Run (or resume) the search; return every trial of it, old and new."""
    from tfmlops.data import pipeline
    from tfmlops.progress import keras_verbose

    kt_classes = _keras_tuner_classes()
    prepared = pipeline.load_prepared(cfg)
    deadline = time.monotonic() + cfg.tune.budget_minutes * 60
    oracle = make_oracle(cfg)
    tuner = kt_classes.TrackedTuner(
        oracle=oracle,
        hypermodel=kt_classes.TrialModel(cfg, prepared, deadline),
        parent=parent, baseline=oracle.baseline,
        directory=str(cfg.paths.tuner),
        project_name=project_name(cfg, key),
        overwrite=False,
        max_model_size=cfg.tune.max_model_params or None,
    )
    oracle.deadline = deadline
    ended_before = {i for i, t in oracle.trials.items() if t.status in ENDED}
    print(f"tune: {cfg.tune.tuner} search in {tuner.project_dir} "
          f"({len(ended_before)} trials finished before, budget {cfg.tune.budget_minutes:g} min)")
    started = time.perf_counter()
    try:
        tuner.search(epochs=cfg.tune.max_epochs, verbose=keras_verbose())
    finally:
        tuner.close_open_trial()
    seconds = time.perf_counter() - started
    trials = [_record(tuner, t, oracle.baseline) for t in _in_order(oracle.trials)]
    # ended now, by this process or (on a chief) by any worker
    ran_now = [t.trial_id for t in trials if t.status in ENDED and t.trial_id not in ended_before]
    return SearchResult(trials, ran_now, seconds, oracle.stop_reason or "done",
                        tuner.hypermodel.profiled_dir)


def _run_worker(cfg: Config) -> dict[str, Any]:
    """A distributed worker: run the chief's trials, nested under the chief's run."""
    key = search_key(cfg)
    parent = tracking.attach_run(cfg, STAGE, {"tfmlops.tune.search": key}, wait_s=WORKER_WAIT_S)
    from tfmlops.data import pipeline
    from tfmlops.progress import keras_verbose

    kt_classes = _keras_tuner_classes()
    deadline = time.monotonic() + cfg.tune.budget_minutes * 60
    oracle = make_oracle(cfg)  # wrapped by keras-tuner in a client of the chief's
    tuner = kt_classes.TrackedTuner(
        oracle=oracle,
        hypermodel=kt_classes.TrialModel(cfg, pipeline.load_prepared(cfg), deadline),
        parent=parent, baseline=oracle.baseline, directory=str(cfg.paths.tuner),
        project_name=project_name(cfg, key),
        overwrite=False, max_model_size=cfg.tune.max_model_params or None,
    )
    try:
        tuner.search(epochs=cfg.tune.max_epochs, verbose=keras_verbose())
    finally:
        tuner.close_open_trial()
    return {"role": "worker", "tuner_id": tuner.tuner_id, "trials_run": len(tuner.ran_now)}


def make_oracle(cfg: Config):
    """The keras-tuner oracle for `tune.tuner`, seeded, with our budget stop and
    the params' own settings as the first trial of a fresh search."""
    kt_classes = _keras_tuner_classes()
    import keras_tuner as kt

    t = cfg.tune
    direction = "max" if "accuracy" in t.objective else "min"
    common = {
        "objective": kt.Objective(t.objective, direction),
        # keras-tuner replaces a seed of 0 by a random one: shift to keep 0 reproducible
        "seed": cfg.seed + 1,
        "max_retries_per_trial": 0,
        # keras-tuner raises (losing the trial's state) after N failures in a row;
        # BudgetMixin stops the search cleanly instead.
        "max_consecutive_failed_trials": 1_000_000,
    }
    if t.tuner == "hyperband":
        oracle = kt_classes.HyperbandOracle(max_epochs=t.max_epochs, factor=t.hyperband_factor,
                                            hyperband_iterations=1, **common)
        oracle.max_trials = t.max_trials  # hyperband has no trial cap of its own
    elif t.tuner == "bayesian":
        # keras-tuner's default (3 x dimensions random points) would make a
        # 12-trial search purely random
        oracle = kt_classes.BayesianOracle(max_trials=t.max_trials,
                                           num_initial_points=max(3, t.max_trials // 3), **common)
    else:
        oracle = kt_classes.RandomOracle(max_trials=t.max_trials, **common)
    oracle.baseline, oracle.baseline_skipped = search_space.baseline(cfg)
    return oracle


@functools.cache
def _keras_tuner_classes():
    """keras-tuner subclasses, defined on first use: importing this module stays light."""
    import keras
    import keras_tuner as kt

    from tfmlops import profiling
    from tfmlops.data import pipeline
    from tfmlops.model.builder import build_model
    from tfmlops.model.optim import make_loss, make_optimizer, make_schedule

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
                print(f"tune: no baseline trial: {self.baseline_skipped}")
                return super()._random_values()
            print("tune: trial 0 is the baseline: the params' own settings")
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

    class StopAtDeadline(keras.callbacks.Callback):
        """Ends a trial at the first epoch end past the search's wall-clock budget."""

        def __init__(self, deadline: float):
            super().__init__()
            self.deadline = deadline

        def on_epoch_end(self, epoch, logs=None):
            if time.monotonic() > self.deadline:
                self.model.stop_training = True

    class TrialModel(kt.HyperModel):
        """Builds a trial's model from its values with the shared builder; trains it
        on the project's pipeline with the trial's batch size, optimizer and schedule."""

        def __init__(self, cfg: Config, prepared, deadline: float):
            super().__init__(name="tfmlops")
            self.cfg, self.prepared, self.deadline = cfg, prepared, deadline
            self._datasets: dict[int, tuple] = {}
            self.profiled_dir: Path | None = None

        def declare_hyperparameters(self, hp):
            search_space.declare(hp, self.cfg.tune.space)

        def build(self, hp):
            trial_cfg = search_space.config_from_values(
                self.cfg, search_space.declare(hp, self.cfg.tune.space))
            keras.utils.set_random_seed(self.cfg.seed)  # same values, same initial weights
            model = build_model(trial_cfg.model, keras, self.prepared.input_shape,
                                self.prepared.num_classes)
            return model

        def fit(self, hp, model, *args, epochs=1, initial_epoch=0, callbacks=(), verbose=2,
                **kwargs):
            trial_cfg = search_space.config_from_values(
                self.cfg, search_space.declare(hp, self.cfg.tune.space))
            t = trial_cfg.train
            train_ds, val_ds = self._data(t.batch_size)
            steps = math.ceil(self.prepared.counts["train"] / t.batch_size)
            # The schedule spans the epochs this fit runs (a hyperband round that
            # continues an earlier trial starts a fresh optimizer too).
            lr = make_schedule(t.schedule, t.optimizer.learning_rate,
                               steps * max(epochs - initial_epoch, 1), keras)
            model.compile(optimizer=make_optimizer(t.optimizer, lr, keras),
                          loss=make_loss(t.loss, self.prepared.num_classes, keras),
                          metrics=["accuracy"])
            extra = [keras.callbacks.TerminateOnNaN(), StopAtDeadline(self.deadline)]
            patience = self.cfg.tune.early_stopping_patience
            if patience:
                extra.append(keras.callbacks.EarlyStopping(
                    monitor=self.cfg.tune.objective, patience=patience,
                    mode="max" if "accuracy" in self.cfg.tune.objective else "min"))
            if self.cfg.profiling.enabled and self.profiled_dir is None:
                self.profiled_dir = profiling.fresh_profile_dir(self.cfg, STAGE)
                extra.append(keras.callbacks.TensorBoard(
                    log_dir=str(self.profiled_dir), write_graph=False, histogram_freq=0,
                    profile_batch=profiling.keras_profile_batch(self.cfg, steps)))
            with warnings.catch_warnings():
                # tf.data of unknown length: Keras warns at the end of each first epoch
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                return model.fit(train_ds, validation_data=val_ds, epochs=epochs,
                                 initial_epoch=initial_epoch, callbacks=[*callbacks, *extra],
                                 verbose=verbose, shuffle=False)  # the pipeline shuffles

        def _data(self, batch_size: int):
            if batch_size not in self._datasets:
                self._datasets[batch_size] = (
                    pipeline.dataset(self.cfg, self.prepared, "train", batch_size=batch_size,
                                     training=True),
                    pipeline.dataset(self.cfg, self.prepared, "val", batch_size=batch_size),
                )
            return self._datasets[batch_size]

    class TrackedTuner(kt.Tuner):
        """One tuner for the three oracles: runs hyperband's continued rounds and
        opens one nested MLflow run per trial."""

        def __init__(self, *args, parent: tracking.StageRun, baseline: dict | None, **kwargs):
            self.parent = parent
            self.baseline = baseline  # the params' own values (None: not searched)
            self.ran_now: list[str] = []
            self._child: tracking.StageRun | None = None
            self._started = 0.0
            super().__init__(*args, **kwargs)

        # hyperband: epochs of this round, continuing from an earlier trial's weights
        def run_trial(self, trial, *fit_args, **fit_kwargs):
            values = trial.hyperparameters.values
            if "tuner/epochs" in values:
                fit_kwargs["epochs"] = values["tuner/epochs"]
                fit_kwargs["initial_epoch"] = values["tuner/initial_epoch"]
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
            values = trial.hyperparameters.values
            baseline = search_space.is_baseline(trial.trial_id, values, self.baseline)
            self._child = self.parent.start_child(
                f"trial-{trial.trial_id}",
                tags={"tfmlops.tune.trial": trial.trial_id, "tfmlops.tune.tuner_id": self.tuner_id,
                      "tfmlops.tune.baseline": str(baseline).lower()})
            self._child.log_params(dict(values))

        def on_epoch_end(self, trial, model, epoch, logs=None):
            if self._child is not None:
                self._child.log_metrics(dict(logs or {}), step=epoch)

        def on_trial_end(self, trial):
            try:
                super().on_trial_end(trial)  # the oracle records the result and status
            finally:
                self._finish_child(trial)

        def _finish_child(self, trial):
            child, self._child = self._child, None
            if child is None:
                return
            ended = self.oracle.get_trial(trial.trial_id)
            seconds = time.perf_counter() - self._started
            status = "FINISHED" if ended.status == "COMPLETED" else "FAILED"
            child.set_tags({"tfmlops.tune.status": ended.status})
            if ended.message:
                child.set_tags({"tfmlops.tune.error": _last_line(ended.message)})
            if ended.score is not None and status == "FINISHED":
                child.log_metrics({"score": ended.score, "best_epoch": ended.best_step or 0})
            child.log_metrics({"seconds": seconds})
            child.end(status)
            self.ran_now.append(trial.trial_id)
            side = {"seconds": round(seconds, 2), "run_id": child.run_id,
                    "tuner_id": self.tuner_id}
            write_json(Path(self.get_trial_dir(trial.trial_id)) / TRIAL_FILE, side)

        def close_open_trial(self):
            """End the child run of a trial interrupted by an exception or a kill."""
            if self._child is not None:
                self._child.end("KILLED")
                self._child = None

    return _Namespace(HyperbandOracle=HyperbandOracle, BayesianOracle=BayesianOracle,
                      RandomOracle=RandomOracle, TrialModel=TrialModel,
                      TrackedTuner=TrackedTuner)


class _Namespace:
    def __init__(self, **items):
        self.__dict__.update(items)


# ------------------------------------------------------------- results

def _in_order(trials: dict) -> list:
    return sorted(trials.values(), key=lambda t: (int(t.trial_id), t.trial_id))


def _record(tuner, trial, baseline: dict[str, Any] | None) -> TrialRecord:
    side_path = Path(tuner.project_dir) / f"trial_{trial.trial_id}" / TRIAL_FILE
    side = json.loads(side_path.read_text()) if side_path.is_file() else {}
    values = dict(trial.hyperparameters.values)
    return TrialRecord(
        trial_id=str(trial.trial_id), status=str(trial.status),
        score=None if trial.score is None else float(trial.score),
        best_epoch=trial.best_step, values=values,
        seconds=side.get("seconds"), run_id=side.get("run_id"), message=trial.message,
        baseline=search_space.is_baseline(trial.trial_id, values, baseline),
    )


def _best_trial(cfg: Config, trials: list[TrialRecord]) -> TrialRecord:
    done = [t for t in trials if t.status == "COMPLETED" and t.score is not None
            and math.isfinite(t.score)]
    if not done:
        failed = [t for t in trials if t.message]
        why = f"; the first failure: {_last_line(failed[0].message)}" if failed else ""
        raise RuntimeError(f"tune: none of the {len(trials)} trials completed{why}")
    sign = 1 if "accuracy" in cfg.tune.objective else -1
    # best score; ties go to the earlier trial
    return max(done, key=lambda t: (sign * t.score, -int(t.trial_id)))


def _metrics(cfg: Config, result: SearchResult, best: TrialRecord) -> dict[str, Any]:
    statuses = [t.status for t in result.trials]
    return {
        "best_score": round(best.score, 6),
        "best_trial": int(best.trial_id),
        "best_learning_rate": best.values.get("learning_rate"),
        "trials": len(result.trials),
        "trials_completed": statuses.count("COMPLETED"),
        "trials_failed": statuses.count("FAILED") + statuses.count("INVALID"),
        "trials_run": len(result.ran_now),
        "search_seconds": round(result.seconds, 2),
        "budget_exhausted": int(result.stop_reason == "budget"),
        "stopped_after_failures": int(result.stop_reason == "failures"),
    }


def _columns() -> list[str]:
    return [*FIXED_COLUMNS, *search_space.HP_NAMES]


def _rows(cfg: Config, trials: list[TrialRecord]) -> list[dict[str, Any]]:
    rows = []
    for t in trials:
        row = {"trial": int(t.trial_id), "baseline": t.baseline, "score": t.score,
               "status": t.status,
               "epochs": t.values.get("tuner/epochs", cfg.tune.max_epochs),
               "best_epoch": t.best_epoch, "seconds": t.seconds}
        row.update({k: t.values.get(k) for k in search_space.HP_NAMES})
        rows.append(row)
    return rows


def _best_text(cfg: Config, best: TrialRecord, key: str, chosen: Config,
               winner: final_round.FinalEntry | None) -> str:
    head = (f"best trial {best.trial_id} of search {project_name(cfg, key)}: "
            f"{cfg.tune.objective} {best.score:.6g}")
    if winner is not None:
        head += (f"\n# final round at train's length: {winner.name} wins "
                 f"({cfg.tune.objective} {winner.score:.6g})")
    return _header(head) + yaml.safe_dump(hparams.tuned_tree(chosen), sort_keys=False)


def _write_untuned(cfg: Config) -> dict[str, Any]:
    """tune.enabled: false: the params' own settings, no search."""
    out = staging_dir(cfg.paths.tuned)
    metrics = {"trials": 0, "trials_run": 0, "search_seconds": 0.0, "enabled": 0}
    with tracking.stage_run(cfg, STAGE, out, upstream={"prepare": cfg.paths.prepared},
                            params=_params(cfg)) as parent:
        parent.set_tags({"tfmlops.tune.enabled": "false"})
        text = _header("tune.enabled: false: the settings of params.yaml, no search")
        write_text(out / hparams.BEST_FILE, text + yaml.safe_dump(hparams.tuned_tree(cfg),
                                                                   sort_keys=False))
        write_csv(_csv_path(cfg), [], _columns())
        parent.log_metrics(metrics)
        swap_in(out, cfg.paths.tuned)
        parent.log_artifact(hparams.best_path(cfg), "tune")
    write_json(_report_path(cfg), metrics)
    print(f"tune: disabled; wrote the params' own settings to {hparams.best_path(cfg)}")
    return metrics


def _log_plots(parent: tracking.StageRun, cfg: Config, rows: list[dict[str, Any]]) -> None:
    """Score per trial (with the best so far) and score against learning rate."""
    if not parent.active:
        return
    from matplotlib.figure import Figure

    done = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    failed = [r for r in rows if r["status"] != "COMPLETED"]
    better = max if "accuracy" in cfg.tune.objective else min
    best_so_far, running = [], None
    for r in done:
        running = r["score"] if running is None else better(running, r["score"])
        best_so_far.append(running)

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.scatter([r["trial"] for r in done], [r["score"] for r in done], label="trial")
    ax.step([r["trial"] for r in done], best_so_far, where="post", color="C1",
            label="best so far")
    for r in failed:
        ax.axvline(r["trial"], color="C3", alpha=0.3, linestyle=":")
    ax.set(xlabel="trial", ylabel=cfg.tune.objective,
           title=f"{cfg.tune.tuner}: score per trial" + (" (dotted: failed)" if failed else ""))
    ax.legend()
    parent.log_figure(fig, "plots/tune_score_per_trial.png")

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for i, schedule in enumerate(sorted({str(r["schedule"]) for r in done})):
        pts = [r for r in done if str(r["schedule"]) == schedule]
        ax.scatter([r["learning_rate"] for r in pts], [r["score"] for r in pts],
                   color=f"C{i}", label=schedule)
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate", ylabel=cfg.tune.objective,
           title="score against learning rate, by schedule")
    ax.legend()
    parent.log_figure(fig, "plots/tune_score_vs_learning_rate.png")


def _params(cfg: Config) -> dict[str, Any]:
    d = cfg.to_dict()
    return {"seed": cfg.seed, "model": d["model"], "tune": d["tune"],
            "train": {k: d["train"][k] for k in (*hparams.TUNABLE_TRAIN_KEYS, "loss")}}


def _csv_path(cfg: Config) -> Path:
    return Path(cfg.paths.reports) / "tune_trials.csv"


def _report_path(cfg: Config) -> Path:
    return Path(cfg.paths.reports) / "tune.json"


def _header(text: str) -> str:
    return (f"# {text}\n"
            "# train merges: params.yaml <- this file (train.use_tuned) <- train.overrides\n")


def _last_line(message: str) -> str:
    lines = [line for line in str(message).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:500]
