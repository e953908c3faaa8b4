"""What a training run records and writes after `fit`, the same on one machine and on
several workers: the MLflow run's setup, the saved model, reports, plots and metrics."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict
from pathlib import Path

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.data import pipeline
from tfmlops.files import swap_in, write_csv, write_json
from tfmlops.model.artifacts import MODEL_FILE, write_resolved
from tfmlops.training.context import STAGE, TrainContext
from tfmlops.training.evaluate import classification_report, evaluate_test, summary

OUTPUTS = ("resolved_params.yaml", "tune_merge.json", "precision.json",
           "classification_report.json", "confusion_matrix.png", "training_curves.png")


def params(merged: Config) -> dict:
    d = merged.to_dict()
    return {"seed": d["seed"], "model": d["model"], "train": d["train"],
            "pipeline": d["pipeline"]}


@contextlib.contextmanager
def open_run(ctx: TrainContext):
    """The stage's MLflow run (`ctx.run`), its setup logged and a killed run's epochs replayed."""
    from tfmlops.model import callbacks as cb

    cfg = ctx.cfg
    upstream = {"prepare": cfg.paths.prepared, "tune": cfg.paths.tuned}
    # Kept by a separate process: MLflow's import and the store's first calls cost
    # seconds of CPU (issue 16: tracking's fixed cost on a short run).
    with tracking.sidecar_run(cfg, STAGE, ctx.folders.out, upstream=upstream,
                              params=params(ctx.merged)) as run:
        ctx.run = run
        _log_setup(ctx)
        for row in ctx.rows:  # the killed run's epochs, so this run holds the whole curve
            run.log_metrics(cb.metrics_of(row), step=row["epoch"])
        yield run


def _log_setup(ctx: TrainContext) -> None:
    run, merged, placement, changes = ctx.run, ctx.merged, ctx.placement, ctx.changes
    run.log_params({
        "resolved": {
            "precision_policy": ctx.policy,
            "strategy": placement["strategy"],
            "strategy_class": placement["strategy_class"],
            "replicas": placement["replicas"],
            "workers": placement["workers"],
            "per_replica_batch_size": merged.train.batch_size,
            "global_batch_size": ctx.global_batch,
            "jit_compile_requested": merged.train.jit_compile,
            "input_cache": pipeline.cache_choice(merged, ctx.prepared)["mode"],
        },
        # The tune merge as params: key -> "params.yaml value -> used value (source)".
        "tune_merge": {c["key"]: f"{c['params']} -> {c['used']} ({c['source']})"
                       for c in changes},
    })
    run.log_dict(changes, "train/tune_merge.json")
    run.set_tags({"tfmlops.precision": ctx.policy, "tfmlops.strategy": placement["strategy"],
                  "tfmlops.trained_params_hash": merged.digest(),
                  "tfmlops.resumed_after_epoch": ctx.done})
    run.log_dataset("prepared", str(Path(merged.paths.prepared).resolve()),
                    tracking.data_version(merged), context="training")


def evaluate_and_save(ctx: TrainContext, model):
    """The model and its params into the staged outputs, then the test-split evaluation,
    while the model is logged to MLflow in a thread (`finish` waits for it)."""
    model.save(ctx.folders.out / MODEL_FILE)  # saved locally before anything may fail
    write_resolved(ctx.merged, ctx.folders.out)
    write_json(ctx.folders.out / "tune_merge.json", ctx.changes)
    # The policy and why (with a timing: its images/s and margin), beside the model it made.
    decision = asdict(ctx.precision) if ctx.precision is not None else {"policy": ctx.policy}
    write_json(ctx.folders.out / "precision.json",
               {"setting": ctx.merged.train.precision, **decision})
    example = pipeline.rows_at(ctx.merged, ctx.prepared, "test", [0, 1], batch_size=2)
    ctx.model_logging = ctx.run.start_keras_model(model, saved_path=ctx.folders.out / MODEL_FILE,
                                                  input_example=example)
    return evaluate_test(model, ctx.merged, ctx.prepared, ctx.global_batch)


def finish(ctx: TrainContext, model, evaluation, rows: list[dict], fit_seconds: float):
    """The chief, after `evaluate_and_save`: swap the outputs in, write the reports,
    plots and metrics, empty the backup, log it all; returns (metrics, final folder)."""
    from tfmlops.model import callbacks as cb

    test, _, y_test, predicted = evaluation
    # The model is now in paths.train: nothing after this line can lose it.
    final = swap_in(ctx.folders.out, ctx.cfg.paths.train)
    report = classification_report(y_test, predicted, ctx.prepared.classes)
    write_json(final / "classification_report.json", report)
    metrics = summary(rows, test, report, ctx, fit_seconds=fit_seconds,
                      wall_seconds=time.perf_counter() - ctx.started,
                      profile=profiling.trace_summary(ctx.folders.profile))
    reports = Path(ctx.cfg.paths.reports)
    write_csv(reports / "train_history.csv", rows, cb.HISTORY_COLUMNS)
    write_json(reports / "train.json", metrics)
    cb.clear(ctx.folders.backup)
    plot(final, rows, report, ctx.prepared.classes)
    _log_results(ctx.run, metrics, final, reports, ctx.folders.profile)
    # The model logged in a thread since evaluate_and_save: a failure other than the
    # store being away (then its file is queued) fails the stage here.
    ctx.model_logging.wait(final / MODEL_FILE)
    return metrics, final


def _log_results(run, metrics, final: Path, reports: Path, profile_dir: Path) -> None:
    # `images_per_s` is also the per-epoch series: the summary gets its own name.
    run.log_metrics({("steady_images_per_s" if k == "images_per_s" else k): v
                     for k, v in metrics.items()})
    for name in OUTPUTS:
        run.log_artifact(final / name, "train")
    run.log_artifact(reports / "train_history.csv", "reports")
    run.log_artifact(reports / "train.json", "reports")
    if profiling.trace_files(profile_dir):
        run.log_artifact(profile_dir, "profile")


def plot(folder: Path, rows: list[dict], report: dict, classes: list[str]) -> None:
    """confusion_matrix.png and training_curves.png, each written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    matrix = report["confusion_matrix"]
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(len(classes)), yticks=range(len(classes)), xticklabels=classes,
           yticklabels=classes, xlabel="predicted", ylabel="true",
           title=f"test accuracy {report['accuracy']:.4f}")
    for i, line in enumerate(matrix):
        for j, count in enumerate(line):
            if count:
                ax.text(j, i, str(count), ha="center", va="center", fontsize=7)
    _save_figure(fig, folder / "confusion_matrix.png")

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [r["epoch"] for r in rows]
    for key, ax in (("loss", loss_ax), ("accuracy", acc_ax)):
        ax.plot(epochs, [r[key] for r in rows], label=f"train {key}")
        ax.plot(epochs, [r[f"val_{key}"] for r in rows], label=f"val {key}")
        ax.set(xlabel="epoch", title=key)
        ax.legend()
    _save_figure(fig, folder / "training_curves.png")
    plt.close("all")


def _save_figure(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)
