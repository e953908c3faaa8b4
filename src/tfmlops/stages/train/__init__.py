"""Stage `train`: the final model, under a tf.distribute strategy, tracked in MLflow.

Reads the prepared TFRecords and (with `train.use_tuned`) tune's
`best_hparams.yaml`, merged as params <- tuned <- train.overrides. Writes
`paths.train/` (model.keras, resolved_params.yaml, tune_merge.json, precision.json,
classification_report.json, confusion_matrix.png, training_curves.png,
mlflow_run.json), `reports/train.json`, `reports/train_history.csv` and the suspected
label errors of val and test (`reports/label_issues.csv` and `.png`).

Order of work, and why:
1. bad input fails before TensorFlow does anything (missing or stale tune output,
   ImageNet weights neither in Keras' cache nor downloadable, missing or stale
   prepared data, a spec that cannot build, a batch larger than the data);
2. devices and the strategy come before any other TensorFlow op (logical CPUs and
   MultiWorkerMirroredStrategy cannot be set up later in a process);
3. the harness (harness.py) takes the output lock, opens the run (kept by a
   sidecar process, tracking/sidecar.py) and swaps the outputs in; the backup of a
   killed run is resumed (stages/train/backup.py), and emptied after a successful one;
4. the model is saved and swapped in before anything that may fail after it
   (plots, MLflow).
Under multi-worker training every worker runs this code (fitting and reading the
weights involve collective ops); only the chief writes outputs, the others write
into a scratch folder that is removed. The flow: fit.setup -> fit.folders/resume ->
fit.fit -> fit.final_model -> results.save -> swap -> results.finish.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path

from tfmlops import harness, tracking
from tfmlops.artifacts import PRECISION, data_version
from tfmlops.config import Config
from tfmlops.model import backbones, hparams
from tfmlops.model.trained import MODEL_FILE
from tfmlops.stages import StageSpec

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="train",
    help="the final mixed-precision run under a tf.distribute strategy",
    output="train",
    upstream=("prepare", "tune"),
    params=("seed", "model", "train", "pipeline"),
    reports=("train.json", "train_history.csv", "label_issues.csv"),
    sidecar=True,
)


def run(cfg: Config) -> dict:
    started = time.perf_counter()
    tuned = None
    if cfg.train.use_tuned:
        tuned = hparams.read_best(cfg)
        hparams.check_fresh(cfg, data_version(cfg.paths.prepared))  # a stale search is refused
    merged, changes = hparams.merge(cfg, tuned)
    backbones.ensure_weights(merged.model)  # ImageNet weights: in Keras' cache, or fetched now
    # The run's process starts now: it imports MLflow while this one imports TensorFlow.
    tracking.start_sidecar(cfg)
    try:
        return _train(cfg, merged, changes, started)
    except BaseException:  # before its run took the sidecar over: it is closed, not left
        tracking.discard_sidecar()
        raise


def _train(cfg: Config, merged: Config, changes: list, started: float) -> dict:
    from tfmlops.data import pipeline  # imports TensorFlow (no op runs yet)
    from tfmlops.model import fitting
    from tfmlops.model.builder import check_buildable
    from tfmlops.stages.train import fit

    prepared = pipeline.load_prepared(merged)
    check_buildable(merged.model, prepared.input_shape)
    setup = fit.setup(cfg, merged, prepared)  # before any other TensorFlow op
    # A non-chief worker's checkpoints, history and outputs: removed at the end.
    scratch = (contextlib.nullcontext() if setup.chief else
               tempfile.TemporaryDirectory(prefix="tfmlops-train-worker-",
                                           ignore_cleanup_errors=True))
    with scratch as folder, fitting.op_determinism(merged.pipeline.deterministic):
        return _fit_and_save(cfg, merged, changes, prepared, setup,
                             Path(folder) if folder else None, started)


def _fit_and_save(cfg: Config, merged: Config, changes: list, prepared, setup,
                  scratch: Path | None, started: float) -> dict:
    import keras

    from tfmlops.model import fitting, precision
    from tfmlops.stages.train import fit, results

    # Before the seed: timing the policies builds models (it draws random numbers). On one
    # machine, the timed decision tune's final round trained this architecture with is
    # reused (read only), so train reproduces the round's curve. Across workers it is not
    # timed: each worker would time on its own and could pick another policy.
    decision = (fitting.decide_precision(merged, prepared, merged.train.batch_size, timed=False)
                if setup.across_workers else
                fitting.decide_precision(merged, prepared, merged.train.batch_size, write=False,
                                     cache_file=Path(cfg.paths.tuned) / PRECISION))
    setup.keras.utils.set_random_seed(merged.seed)
    output = cfg.paths.train if scratch is None else scratch
    with harness.stage(cfg, SPEC, params=results.params(merged), output=output,
                       staged=scratch is None) as st:
        profile = st.profile_dir() if scratch is None else scratch / "tb"
        folders = fit.folders(cfg, merged, setup, profile, scratch)
        resumed = fit.resume(cfg, merged, setup, folders)
        results.log_setup(st.run, merged, prepared, setup, decision, changes, resumed)
        fitted = fit.fit(cfg, merged, prepared, setup, decision.policy, folders, resumed, st.run)
        with precision.global_policy(decision.policy, keras):
            model = fit.final_model(fitted, merged, prepared, setup,
                                    folders.backup / fitting.BEST_WEIGHTS)
            if model is None:  # a non-chief worker across workers: the chief finishes alone
                return {"task": fit.task_name(setup.strategy), "epochs_run_now": len(fitted.rows)}
            logging_model = results.save(st.out, model, merged, changes, decision, st.run,
                                         prepared)
            evaluation = results.evaluate_test(model, merged, prepared, setup.global_batch)
        final = st.swap()  # the model is now in paths.train: nothing after this can lose it
        metrics = results.finish(cfg, final, evaluation, fitted, resumed, setup, prepared,
                                 st.run, folders.profile, logging_model, started)
        st.report(metrics, log_metrics=False)  # logged by `finish` (steady_images_per_s)
    workers = f" on {setup.placement['workers']} workers" if setup.across_workers else ""
    log.info(f"train: test accuracy {metrics['test_accuracy']:.4f} after {metrics['epochs_run']} "
             f"epochs{workers} ({metrics['wall_seconds']:.0f} s, {metrics['images_per_s']:.0f} "
             f"images/s) -> {final / MODEL_FILE}")
    return metrics
