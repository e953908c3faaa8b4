"""Stage `tune`: a keras-tuner search over architectures and learning-rate schedules.

Output: `paths.tuned/best_hparams.yaml` (the contract of model/hparams.py: a
partial params tree that `train` merges), `searched_params.json` (what the search read:
train refuses the result once those params change), `final_round.csv`, `fit/` (the
final round winner's fit, which train adopts), `mlflow_run.json` and, with
`train.precision: timed` on a CPU with bf16 units, `precision.json` (the timed decisions
train reuses), swapped in
whole; `reports/tune.json` (metrics) and `reports/tune_trials.csv` (one row per
trial). With `tune.enabled: false` the file holds the params' own settings and
`paths.tuner` is left as it was (created empty if missing: DVC requires every output).

How the search runs (budgets, resume, baseline, final round, MLflow's nested runs,
the distributed mode) is told in search.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfmlops import harness
from tfmlops.artifacts import BEST_HPARAMS, FINAL_ROUND, TAG_TUNE_SEARCH, data_version, report_path
from tfmlops.files import write_csv, write_text
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="tune",
    help="keras-tuner search over architectures and learning-rate schedules",
    output="tuned",
    upstream=("prepare",),
    params=("seed", "model", "tune", "pipeline", "train"),
    reports=("tune.json", "tune_trials.csv"),
    headline=("trials_run", "trials_failed", "best_score", "final_winner_score"),
    sidecar=True,
)
WORKER_WAIT_S = 120.0  # how long a worker waits for the chief's parent run


def run(cfg: Config) -> dict[str, Any]:
    from tfmlops.model import backbones, hparams
    from tfmlops.stages.tune import final_round, report, search_space
    from tfmlops.stages.tune.search import distributed_role, search_key

    search_space.check_fits(cfg.tune.space, cfg.data.image_size)
    if not cfg.tune.enabled:
        return _write_untuned(cfg)
    # every backbone a trial or the final round may build: ImageNet weights fetched first
    backbones.ensure_weights(cfg.model, [cfg.model.backbone, *(cfg.tune.space.backbone or [])])
    role = distributed_role()
    if role == "worker":
        return _run_worker(cfg)

    key = search_key(cfg)
    # The run and its trials' nested runs are kept by the sidecar, which imports MLflow
    # while this process imports TensorFlow (in the block).
    with harness.stage(cfg, SPEC, params=_params(cfg)) as st:
        from tfmlops.stages.tune import tuner  # keras-tuner, Keras, TensorFlow

        out, parent = st.out, st.run
        parent.set_tags({TAG_TUNE_SEARCH: key, "tfmlops.tune.role": role,
                         "tfmlops.tune.tuner": cfg.tune.tuner})
        result = tuner.search(cfg, parent, key)
        best = report.best_trial(cfg, result.trials)
        finalists = final_round.train_finalists(cfg, parent, result.trials, best)
        winner = final_round.pick_winner(cfg, finalists) if finalists else None
        best_cfg = winner.config if winner else search_space.config_from_values(cfg, best.values)
        rows = report.trial_rows(cfg, result.trials)
        write_csv(_csv_path(cfg), rows, report.columns())
        write_text(out / BEST_HPARAMS, report.best_text(cfg, best, key, best_cfg, winner,
                                                       result.stop_reason == "budget"))
        hparams.write_searched(cfg, out, data_version(cfg.paths.prepared))
        metrics = st.report({**report.search_metrics(result, best),
                             **final_round.final_round_metrics(finalists, winner)})
        if finalists:
            write_csv(out / FINAL_ROUND, final_round.final_round_rows(finalists),
                      final_round.COLUMNS)
            final_round.final_fit.keep_winner(cfg, out, winner)  # train adopts it (kept_fit.py)
        report.pass_on_precision(cfg, out)

        parent.log_params({"best": {k: best.values[k] for k in search_space.HP_NAMES
                                    if k in best.values}})
        parent.set_tags({"tfmlops.tune.best_trial": best.trial_id,
                         **({"tfmlops.tune.best_run": best.run_id} if best.run_id else {}),
                         **({"tfmlops.tune.winner": winner.name} if winner else {})})
        parent.log_artifact(_csv_path(cfg), "tune")
        report.log_plots(parent, cfg, rows)
        if result.profile_dir is not None:
            parent.log_artifact(result.profile_dir, "profile")
        tuned_dir = st.swap()
        parent.log_artifact(hparams.best_path(cfg), "tune")
        if finalists:
            parent.log_artifact(tuned_dir / FINAL_ROUND, "tune")
    report.log_summary(cfg, metrics, best, best_cfg, winner)
    return metrics


def _run_worker(cfg: Config) -> dict[str, Any]:
    """A distributed worker: run the chief's trials, nested under the chief's run."""
    from tfmlops.stages.tune.search import search_key

    key = search_key(cfg)
    with harness.attached(cfg, SPEC, {TAG_TUNE_SEARCH: key}, WORKER_WAIT_S) as st:
        from tfmlops.stages.tune import tuner  # keras-tuner, Keras, TensorFlow

        return tuner.work(cfg, st.run, key)


def _write_untuned(cfg: Config) -> dict[str, Any]:
    """tune.enabled: false: the params' own settings, no search."""
    import yaml

    from tfmlops.model import hparams
    from tfmlops.stages.tune import report

    with harness.stage(cfg, SPEC, params=_params(cfg)) as st:
        out, parent = st.out, st.run
        metrics = st.report({"trials": 0, "trials_run": 0, "search_seconds": 0.0, "enabled": 0})
        parent.set_tags({"tfmlops.tune.enabled": "false"})
        text = report.header("tune.enabled: false: the settings of params.yaml, no search")
        write_text(out / BEST_HPARAMS, text + yaml.safe_dump(hparams.tuned_tree(cfg),
                                                                   sort_keys=False))
        hparams.write_searched(cfg, out, data_version(cfg.paths.prepared))
        write_csv(_csv_path(cfg), [], report.columns())
        st.swap()
        parent.log_artifact(hparams.best_path(cfg), "tune")
    # dvc.yaml declares paths.tuner, and DVC fails a stage whose output is missing.
    # A previous search's state stays (persist): re-enabling tune resumes it.
    Path(cfg.paths.tuner).mkdir(parents=True, exist_ok=True)
    log.info(f"tune: disabled; wrote the params' own settings to {hparams.best_path(cfg)}")
    return metrics


def _params(cfg: Config) -> dict[str, Any]:
    from tfmlops.model import hparams

    d = cfg.to_dict()
    return {"seed": cfg.seed, "model": d["model"], "tune": d["tune"],
            "train": {k: d["train"][k] for k in (*hparams.TUNABLE_TRAIN_KEYS, "loss")}}


def _csv_path(cfg: Config) -> Path:
    return report_path(cfg.paths.reports, SPEC.name, "_trials.csv")
