"""What `train` records and writes once the model is fitted, the same on one machine
and across workers: the run's setup, the saved outputs, the test-split evaluation,
the classification report, plots, the history CSV, the label issues confident learning
flags (label_issues.py) and the stage's metrics."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path

from tfmlops import evaluation as ev
from tfmlops import profiling
from tfmlops.artifacts import PRECISION, RESOLVED_PARAMS, TUNE_MERGE, data_version
from tfmlops.config import Config
from tfmlops.data import pipeline
from tfmlops.files import pyplot, write_csv, write_json, write_png
from tfmlops.model.backup import Resume, clear
from tfmlops.model.fitting import HISTORY_COLUMNS, log_precision, metrics_of, sized
from tfmlops.model.trained import MODEL_FILE, write_resolved
from tfmlops.stages.train import label_issues
from tfmlops.stages.train.fit import Setup, Training

OUTPUTS = (RESOLVED_PARAMS, TUNE_MERGE, PRECISION,
           "classification_report.json", "confusion_matrix.png", "training_curves.png")


def params(merged: Config) -> dict:
    """The run's params: what was trained."""
    d = merged.to_dict()
    return {k: d[k] for k in ("seed", "model", "train", "pipeline")}


def log_setup(run, merged: Config, prepared, setup: Setup, chosen, changes: list,
              resumed: Resume) -> None:
    """Into the just-opened run: the precision choice, placement, tune merge, dataset,
    and a killed run's epochs (so this run holds the whole curve)."""
    placement = setup.placement
    run.log_params({
        "resolved": {
            "precision_policy": chosen.policy,
            **placement,  # strategy, strategy_class, replicas, workers
            "per_replica_batch_size": merged.train.batch_size,
            "global_batch_size": setup.global_batch,
            "jit_compile_requested": merged.train.jit_compile,
            "input_cache": pipeline.cache_choice(merged, prepared)["mode"],
        },
        # The tune merge as params: key -> "params.yaml value -> used value (source)".
        "tune_merge": {c["key"]: f"{c['params']} -> {c['used']} ({c['source']})"
                       for c in changes},
    })
    run.log_dict(changes, "train/tune_merge.json")
    run.set_tags({"tfmlops.precision": chosen.policy, "tfmlops.strategy": placement["strategy"],
                  "tfmlops.trained_params_hash": merged.digest(),
                  "tfmlops.resumed_after_epoch": resumed.done})
    run.log_dataset("prepared", str(Path(merged.paths.prepared).resolve()),
                    data_version(merged.paths.prepared), context="training")
    for row in resumed.rows:
        run.log_metrics(metrics_of(row), step=row["epoch"])
    log_precision(run, chosen)


def save(out: Path, model, merged: Config, changes: list, chosen, run, prepared):
    """The model and what it was trained with into `out`, before anything that may fail;
    the model is logged to MLflow in a thread (returned: `finish` waits for it)."""
    model.save(out / MODEL_FILE)
    write_resolved(merged, out)
    write_json(out / TUNE_MERGE, changes)
    # The policy and why (with a timing: its images/s and margin), beside the model it made.
    write_json(out / PRECISION, {"setting": merged.train.precision, **asdict(chosen)})
    example = pipeline.rows_at(merged, prepared, "test", [0, 1], batch_size=2)
    return run.start_keras_model(model, saved_path=out / MODEL_FILE, input_example=example)


def evaluate_test(model, merged: Config, prepared, global_batch: int):
    """(Keras metrics on the test split, the held-out probabilities: test's, and val's too
    unless `train.label_issues` is 0), read batch by batch from the TFRecords: memory for
    the probabilities, not the images. The test predictions serve both the report and the
    label issues."""
    test = model.evaluate(sized(merged, prepared, "test", global_batch), verbose=0,
                          return_dict=True)
    splits = {"test": label_issues.predict(model, prepared, "test", global_batch)}
    if merged.train.label_issues and prepared.counts["val"]:
        splits["val"] = label_issues.predict(model, prepared, "val", global_batch)
    return test, label_issues.HeldOut.of(splits)


def finish(t: Training, final: Path, evaluation, fitted, model_logging,
           started: float) -> tuple[dict, list[tuple[Path, str]]]:
    """With the outputs swapped in (nothing after this can lose the model): the report,
    history, plots and metrics, the backup emptied. Returns the metrics and the files it
    made, each with its artifact folder, for the harness to log (`Stage.keep`)."""
    merged, prepared, reports = t.merged, t.prepared, Path(t.merged.paths.reports)
    test, held = evaluation
    y_test, p_test = held.split("test")
    report = classification_report(y_test, p_test.argmax(axis=1), prepared.classes)
    write_json(final / "classification_report.json", report)
    issues = (label_issues.find(held, merged.train.label_issues, prepared.folder)
              if merged.train.label_issues else None)
    metrics = summary(fitted.rows, test, report, t.resumed.done, t.setup,
                      fit_seconds=fitted.seconds, wall_seconds=time.perf_counter() - started,
                      profile=profiling.trace_summary(t.folders.profile))
    metrics["adopted"] = int(fitted.adopted_from is not None)  # timings: tune's final round
    if issues is not None:  # how many were flagged (0: none), whatever train.label_issues lists
        metrics["label_issues_flagged"] = issues.flagged
    history = write_csv(reports / "train_history.csv", fitted.rows, HISTORY_COLUMNS)
    clear(merged.paths.backup)
    plot(final, fitted.rows, report, prepared.classes)
    # `images_per_s` is also the per-epoch series: the summary gets its own name.
    t.run.log_metrics({("steady_images_per_s" if k == "images_per_s" else k): v
                       for k, v in metrics.items()})
    files = [(final / name, "train") for name in OUTPUTS] + [(history, "reports")]
    files += [(f, "reports") for f in label_issues.write(issues, prepared.classes,
                                                         prepared.folder, reports)]
    t.run.log_dict(metrics, "reports/train.json")  # the harness writes the file at the end
    # The model logged in a thread since `save`: a failure other than the store being
    # away (then its file is queued) fails the stage here.
    model_logging.wait(final / MODEL_FILE)
    return metrics, files


def classification_report(y_true, y_pred, classes: list[str]) -> dict:
    """Confusion matrix (rows: true class) and per-class precision, recall and F1, as
    promote computes them (`evaluation.per_class`); a class never predicted (or never
    present) scores 0, not a warning."""
    import numpy as np

    n = len(classes)
    # The model predicts only the split's classes: no column for an unknown one.
    matrix = ev.confusion(np.asarray(y_true), np.asarray(y_pred), n)[:, :n]
    per_class = {name: {**scores, "recall": scores["recall"] or 0.0}
                 for name, scores in ev.per_class(matrix, classes).items()}
    # the mean of the rounded per-class values, as the report has always shown it
    macro = {k: round(float(np.mean([c[k] for c in per_class.values()])), 6)
             for k in ("precision", "recall", "f1")}
    return {"classes": classes, "confusion_matrix": matrix.tolist(), "per_class": per_class,
            "macro": macro, "accuracy": float(np.trace(matrix) / max(matrix.sum(), 1))}


def summary(rows, test, report, done: int, setup: Setup, *, fit_seconds: float,
            wall_seconds: float, profile: dict) -> dict:
    """reports/train.json: test scores, the best epoch, speed and placement."""
    # Steady state: the first epoch of a process also traces and compiles.
    fresh = [r["images_per_s"] for r in rows if r["epoch"] > done]
    steady = fresh[1:] or fresh
    best = min(rows, key=lambda r: r["val_loss"]) if rows else {}
    return {
        "test_accuracy": float(test["accuracy"]),
        "test_loss": float(test["loss"]),
        "test_macro_f1": report["macro"]["f1"],
        "epochs_run": len(rows),
        "best_epoch": best.get("epoch", 0),
        "best_val_loss": best.get("val_loss"),
        "best_val_accuracy": best.get("val_accuracy"),
        "resumed_after_epoch": done,
        "wall_seconds": round(wall_seconds, 2),
        "fit_seconds": round(fit_seconds, 2),
        "images_per_s": round(statistics.median(steady), 1) if steady else 0.0,
        "replicas": setup.placement["replicas"],
        "global_batch_size": setup.global_batch,
        **{k: round(v, 6) for k, v in profile.items()},
    }


def plot(folder: Path, rows: list[dict], report: dict, classes: list[str]) -> None:
    """confusion_matrix.png and training_curves.png, each written atomically."""
    ev.confusion_png(report["confusion_matrix"], classes, classes,
                     f"test accuracy {report['accuracy']:.4f}", folder / "confusion_matrix.png")
    fig, (loss_ax, acc_ax) = pyplot().subplots(1, 2, figsize=(10, 4))
    epochs = [r["epoch"] for r in rows]
    for key, ax in (("loss", loss_ax), ("accuracy", acc_ax)):
        ax.plot(epochs, [r[key] for r in rows], label=f"train {key}")
        ax.plot(epochs, [r[f"val_{key}"] for r in rows], label=f"val {key}")
        ax.set(xlabel="epoch", title=key)
        ax.legend()
    write_png(folder / "training_curves.png", fig, dpi=100, bbox_inches="tight")
