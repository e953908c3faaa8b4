"""Stage `tune`: a keras-tuner search over architectures and learning-rate schedules.

Output: `paths.tuned/best_hparams.yaml` (the contract of model/hparams.py: a
partial params tree that `train` merges), `searched_params.json` (what the search read:
train refuses the result once those params change), `final_round.csv`, `mlflow_run.json` and, with
`train.precision: timed` on a CPU with bf16 units, `precision.json` (the timed decisions
train reuses), swapped in
whole; `reports/tune.json` (metrics) and `reports/tune_trials.csv` (one row per
trial). With `tune.enabled: false` the file holds the params' own settings and
`paths.tuner` is left as it was (created empty if missing: DVC requires every output).

The search: hyperband (default), bayesian or random over the space of
`model/search_space.py`, every trial built by the shared builder and fed by the
project's tf.data pipeline, with early stopping, under TensorFlow's op determinism
(with the seed: the same trials score the same). Budgets: `max_trials` (any
tuner), `max_epochs` per trial, and `budget_minutes` of wall clock, a guard the
default params do not reach: past it the running trial stops at its epoch's end,
no new trial starts, the best so far is kept, and the log, `reports/tune.json`
(`budget_exhausted`) and best_hparams.yaml's header say the search was cut short
(its result then depends on the machine's speed). keras-tuner's state lives in
`paths.tuner/<tuner>-<key>`, the key hashing everything a trial depends on (space,
tuner, seed, fixed settings, data version): rerunning resumes a killed or budget-stopped search without
redoing finished trials; changing the space starts a fresh one.

Baseline: the first trial of a fresh search (any tuner, distributed too) is
the params' own model and optimizer settings when they all lie in the space
(else one line says which key does not), so the search's best scores at least
what the params' own settings score in it. Its child run is tagged
`tfmlops.tune.baseline=true`; the trials CSV has a `baseline` column.

Final round (`tune.final_candidates`, tuning/final_round.py): the params' own
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

The search itself is in tuning/ (oracles, hypermodel, the one tuner every
role builds, records, reports, the final round); keras-tuner is imported
only inside `run`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import yaml

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.files import staging_dir, swap_in, write_csv, write_json, write_text
from tfmlops.model import backbones, hparams, search_space
from tfmlops.tuning import final_round, report
from tfmlops.tuning.records import TrialRecord
from tfmlops.tuning.search import distributed_role, project_name, search_key

log = logging.getLogger(__name__)

STAGE = "tune"
WORKER_WAIT_S = 120.0  # how long a worker waits for the chief's parent run


def run(cfg: Config) -> dict[str, Any]:
    search_space.check_fits(cfg.tune.space, cfg.data.image_size)
    if not cfg.tune.enabled:
        return _write_untuned(cfg)
    # every backbone a trial or the final round may build: ImageNet weights fetched first
    backbones.ensure_weights(cfg.model, [cfg.model.backbone, *(cfg.tune.space.backbone or [])])
    role = distributed_role()
    if role == "worker":
        return _run_worker(cfg)

    from tfmlops.tuning import tuner  # keras-tuner, Keras, TensorFlow

    out = staging_dir(cfg.paths.tuned)
    key = search_key(cfg)
    with tracking.stage_run(cfg, STAGE, out, upstream={"prepare": cfg.paths.prepared},
                            params=_params(cfg)) as parent:
        parent.set_tags({"tfmlops.tune.search": key, "tfmlops.tune.role": role,
                         "tfmlops.tune.tuner": cfg.tune.tuner})
        result = tuner.search(cfg, parent, key)
        best = report.best_trial(cfg, result.trials)
        final = final_round.train_finalists(cfg, parent, result.trials, best)
        winner = final_round.pick_winner(cfg, final) if final else None
        best_cfg = winner.config if winner else search_space.config_from_values(cfg, best.values)
        rows = report.trial_rows(cfg, result.trials)
        write_csv(_csv_path(cfg), rows, report.columns())
        write_text(out / hparams.BEST_FILE, _best_text(cfg, best, key, best_cfg, winner,
                                                       result.stop_reason == "budget"))
        hparams.write_searched(cfg, out, tracking.data_version(cfg))
        metrics = {**report.search_metrics(result, best), **final_round.final_round_metrics(final, winner)}
        if final:
            write_csv(out / final_round.FILE, final_round.final_round_rows(final), final_round.COLUMNS)
        _pass_on_precision(cfg, out)

        parent.log_params({"best": {k: best.values[k] for k in search_space.HP_NAMES
                                    if k in best.values}})
        parent.log_metrics(metrics)
        parent.set_tags({"tfmlops.tune.best_trial": best.trial_id,
                         **({"tfmlops.tune.best_run": best.run_id} if best.run_id else {}),
                         **({"tfmlops.tune.winner": winner.name} if winner else {})})
        parent.log_artifact(_csv_path(cfg), "tune")
        report.log_plots(parent, cfg, rows)
        if result.profile_dir is not None:
            parent.log_artifact(result.profile_dir, "profile")
        final_dir = swap_in(out, cfg.paths.tuned)
        parent.log_artifact(hparams.best_path(cfg), "tune")
        if final:
            parent.log_artifact(final_dir / final_round.FILE, "tune")
    write_json(_report_path(cfg), metrics)
    _log_summary(cfg, metrics, best, best_cfg, winner)
    return metrics


def _log_summary(cfg: Config, metrics: dict, best: TrialRecord, best_cfg: Config,
                 winner: final_round.FinalEntry | None) -> None:
    if metrics["budget_exhausted"]:
        log.warning(f"tune: the budget of {cfg.tune.budget_minutes:g} min cut the search short "
                    f"after {metrics['trials']} trials: its result depends on this machine's "
                    "speed; raise tune.budget_minutes for a reproducible search")
    chosen = (f"; final round at train's length: {winner.name} wins with "
              f"{cfg.tune.objective} {winner.score:.4f}" if winner else "")
    log.info(f"tune: best {cfg.tune.objective} {best.score:.4f} (trial {best.trial_id}) of "
             f"{metrics['trials']} trials ({metrics['trials_failed']} failed, "
             f"{metrics['trials_run']} run now) in {metrics['search_seconds']:.0f} s{chosen} -> "
             f"{hparams.best_path(cfg)}: {len(best_cfg.model.blocks)} blocks, "
             f"{best_cfg.train.optimizer.name} lr {best_cfg.train.optimizer.learning_rate:.2g}, "
             f"{best_cfg.train.schedule.name}, batch {best_cfg.train.batch_size}")


def _run_worker(cfg: Config) -> dict[str, Any]:
    """A distributed worker: run the chief's trials, nested under the chief's run."""
    key = search_key(cfg)
    parent = tracking.attach_run(cfg, STAGE, {"tfmlops.tune.search": key}, wait_s=WORKER_WAIT_S)
    from tfmlops.tuning import tuner  # keras-tuner, Keras, TensorFlow

    return tuner.work(cfg, parent, key)


def _best_text(cfg: Config, best: TrialRecord, key: str, chosen: Config,
               winner: final_round.FinalEntry | None, cut_short: bool) -> str:
    head = (f"best trial {best.trial_id} of search {project_name(cfg, key)}: "
            f"{cfg.tune.objective} {best.score:.6g}")
    if cut_short:
        head += (f"\n# cut short by tune.budget_minutes ({cfg.tune.budget_minutes:g}): "
                 "a faster or slower machine searches further or less far")
    if winner is not None:
        head += (f"\n# final round at train's length: {winner.name} wins "
                 f"({cfg.tune.objective} {winner.score:.6g})")
    return _header(head) + yaml.safe_dump(hparams.tuned_tree(chosen), sort_keys=False)


def _pass_on_precision(cfg: Config, out: Path) -> None:
    """The timed precision decisions (`timed`, a CPU with bf16 units) beside best_hparams.yaml:
    train reads the one of the architecture it trains, as the final round trained it."""
    from tfmlops.training.fit import PRECISION_CACHE

    decisions = Path(cfg.paths.tuner) / PRECISION_CACHE
    if decisions.is_file():
        shutil.copyfile(decisions, out / PRECISION_CACHE)


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
        hparams.write_searched(cfg, out, tracking.data_version(cfg))
        write_csv(_csv_path(cfg), [], report.columns())
        parent.log_metrics(metrics)
        swap_in(out, cfg.paths.tuned)
        parent.log_artifact(hparams.best_path(cfg), "tune")
    # dvc.yaml declares paths.tuner, and DVC fails a stage whose output is missing.
    # A previous search's state stays (persist): re-enabling tune resumes it.
    Path(cfg.paths.tuner).mkdir(parents=True, exist_ok=True)
    write_json(_report_path(cfg), metrics)
    log.info(f"tune: disabled; wrote the params' own settings to {hparams.best_path(cfg)}")
    return metrics


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
