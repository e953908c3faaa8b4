"""Stage `train`: the final model, under a tf.distribute strategy, tracked in MLflow.

Reads the prepared TFRecords and (with `train.use_tuned`) tune's
`best_hparams.yaml`, merged as params <- tuned <- train.overrides. Writes
`paths.train/` (model.keras, resolved_params.yaml, tune_merge.json, precision.json,
classification_report.json, confusion_matrix.png, training_curves.png,
mlflow_run.json), `reports/train.json`, `reports/train_history.csv` and the val and
test images confident learning flags as mislabelled (`reports/label_issues.csv` and `.png`).

Order of work, and why:
1. bad input fails before TensorFlow does anything (missing or stale tune output,
   ImageNet weights neither in Keras' cache nor downloadable, missing or stale
   prepared data, a spec that cannot build, a batch larger than the data);
2. the harness (harness.py), from the SPEC, takes the output lock and starts the run's
   sidecar process (tracking/sidecar.py), which imports MLflow meanwhile; it runs no
   TensorFlow op, so devices and the strategy still come before any other one (logical
   CPUs and MultiWorkerMirroredStrategy cannot be set up later in a process);
3. the backup of a killed run is resumed (model/backup.py), and emptied after a
   successful one; the harness opens the run and swaps the outputs in;
4. the model is saved and swapped in before anything that may fail after it
   (plots, MLflow).
Under multi-worker training every worker runs this code (fitting and reading the
weights involve collective ops); only the chief writes outputs, the others write
into a scratch folder the harness makes and removes (SPEC.worker_scratch). The flow:
fit.set_up -> fit.folders/resume -> fit.fit -> fit.model_to_save -> results.save -> swap ->
results.finish.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tfmlops import faults, harness
from tfmlops.artifacts import PRECISION, data_version
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="train",
    help="the final mixed-precision run under a tf.distribute strategy",
    output="train",
    upstream=("prepare", "tune"),
    params=("seed", "model", "train", "pipeline"),
    reports=("train.json", "train_history.csv", "label_issues.csv"),
    headline=("test_accuracy", "test_loss", "test_macro_f1", "best_val_accuracy", "best_epoch",
              "epochs_run", "images_per_s"),
    sidecar=True,
    worker_scratch=True,
)


def run(cfg: Config, fresh: bool = False) -> dict:
    """Train (or adopt tune's final-round fit of the same model, unless `fresh`:
    stages/train/adopt.py); the metrics of reports/train.json."""
    from tfmlops.model import backbones, hparams

    started = time.perf_counter()
    tuned = None
    if cfg.train.use_tuned:
        tuned = hparams.read_best(cfg)
        hparams.check_fresh(cfg, data_version(cfg.paths.prepared))  # a stale search is refused
    merged, changes = hparams.merge(cfg, tuned)
    backbones.ensure_weights(merged.model)  # ImageNet weights: in Keras' cache, or fetched now
    # The harness starts the run's process now: it imports MLflow while this one imports
    # TensorFlow. It runs no TensorFlow op: the strategy is still the first one.
    with harness.stage(cfg, SPEC) as st:
        metrics, where = _train(cfg, st, merged, changes, started, fresh)
    if where is not None:
        log.info(where)
    return metrics


def _train(cfg: Config, st, merged: Config, changes: list, started: float,
           fresh: bool) -> tuple[dict, str | None]:
    from tfmlops.data import pipeline  # imports TensorFlow (no op runs yet)
    from tfmlops.model import fitting
    from tfmlops.model.builder import check_buildable
    from tfmlops.stages.train import fit, results

    st.params = results.params(merged)
    prepared = pipeline.load_prepared(merged)
    check_buildable(merged.model, prepared.input_shape)
    setup = fit.set_up(cfg, merged, prepared)  # before any other TensorFlow op
    with fitting.op_determinism(merged.pipeline.deterministic):
        return _fit_and_save(cfg, st, merged, changes, prepared, setup, started, fresh)


def _fit_and_save(cfg: Config, st, merged: Config, changes: list, prepared, setup,
                  started: float, fresh: bool) -> tuple[dict, str | None]:
    import keras

    from tfmlops.model import fitting, precision
    from tfmlops.model.backup import Resume
    from tfmlops.model.trained import MODEL_FILE
    from tfmlops.stages.train import adopt, fit, results

    # Before the seed: timing the policies builds models (it draws random numbers). On one
    # machine, the timed choice tune's final round trained this architecture with is
    # reused (read only), so train reproduces the round's curve. Across workers it is not
    # timed: each worker would time on its own and could pick another policy.
    chosen = (fitting.choose_precision(merged, prepared, merged.train.batch_size, timed=False)
              if setup.across_workers else
              fitting.choose_precision(merged, prepared, merged.train.batch_size, write=False,
                                       cache_file=Path(cfg.paths.tuned) / PRECISION))
    setup.keras.utils.set_random_seed(merged.seed)
    # A non-chief worker's checkpoints, history and traces go to its scratch folder.
    scratch = st.out if st.scratch else None
    profile = st.profile_dir() if scratch is None else scratch / "tb"
    where = fit.folders(cfg, merged, setup, profile, scratch)
    kept = (None if fresh or scratch is not None
            else adopt.kept_fit_to_adopt(cfg, merged, setup, chosen.policy))
    resumed = fit.resume(cfg, merged, setup, where) if kept is None else Resume(0, [], None)
    t = fit.Training(merged, prepared, setup, where, resumed, st.run)
    results.log_setup(st.run, merged, prepared, setup, chosen, changes, t.resumed)
    if kept is None:
        fitted = fit.fit(t, chosen.policy)
    else:  # tune's final round fitted this very model: its fit, not a second one
        model, rows, seconds, source = adopt.adopt_kept_fit(kept, st.run, where.profile)
        fitted = fit.Fitted(model, rows, seconds, adopted_from=source)
    faults.point("train.fitted")  # a test stops train here: every epoch backed up, none saved
    with precision.global_policy(chosen.policy, keras):
        model = fit.model_to_save(t, fitted)
        if model is None:  # a non-chief worker across workers: the chief finishes alone
            return {"task": fit.task_name(setup.strategy), "epochs_run_now": len(fitted.rows)}, None
        logging_model = results.save(st.out, model, merged, changes, chosen, st.run, prepared)
        evaluation = results.evaluate_test(model, merged, prepared, setup.global_batch)
    final = st.swap()  # the model is now in paths.train: nothing after this can lose it
    metrics, files = results.finish(t, final, evaluation, fitted, logging_model, started)
    st.keep(files)
    st.report(metrics, log_metrics=False)  # logged by `finish` (steady_images_per_s)
    workers = f" on {setup.placement['workers']} workers" if setup.across_workers else ""
    workers += " (adopted from tune's final round)" if kept is not None else ""
    return metrics, (f"train: test accuracy {metrics['test_accuracy']:.4f} after "
                     f"{metrics['epochs_run']} epochs{workers} ({metrics['wall_seconds']:.0f} s, "
                     f"{metrics['images_per_s']:.0f} images/s) -> {final / MODEL_FILE}")
