"""The trained model on the test split: Keras metrics, predictions, the
classification report, and the stage's summary metrics."""

from __future__ import annotations

import math
import statistics

from tfmlops.config import Config


def evaluate_test(model, merged: Config, prepared, global_batch: int):
    """(Keras metrics on the test split, None, its labels and predicted classes), both
    read batch by batch from the TFRecords: memory does not grow with the split."""
    import tensorflow as tf

    from tfmlops.data import pipeline

    steps = math.ceil(prepared.counts["test"] / global_batch)  # known: Keras does not warn
    test_ds = pipeline.dataset(merged, prepared, "test", batch_size=global_batch)
    test = model.evaluate(test_ds.apply(tf.data.experimental.assert_cardinality(steps)),
                          verbose=0, return_dict=True)
    y_test, outputs = pipeline.predicted(model, merged, prepared, "test", global_batch)
    return test, None, y_test, outputs.argmax(-1)


def classification_report(y_true, y_pred, classes: list[str]) -> dict:
    """Confusion matrix (rows: true class) and per-class precision, recall and F1.

    A class never predicted (or never present) scores 0, not a warning.
    """
    import numpy as np
    from sklearn import metrics

    labels = list(range(len(classes)))
    matrix = metrics.confusion_matrix(y_true, y_pred, labels=labels)
    scores = metrics.classification_report(y_true, y_pred, labels=labels, target_names=classes,
                                           output_dict=True, zero_division=0)
    per_class = {name: {"precision": round(float(scores[name]["precision"]), 6),
                        "recall": round(float(scores[name]["recall"]), 6),
                        "f1": round(float(scores[name]["f1-score"]), 6),
                        "support": int(scores[name]["support"])} for name in classes}
    # the mean of the rounded per-class values, as the report has always shown it
    macro = {k: round(float(np.mean([c[k] for c in per_class.values()])), 6)
             for k in ("precision", "recall", "f1")}
    return {"classes": classes, "confusion_matrix": matrix.tolist(), "per_class": per_class,
            "macro": macro, "accuracy": float(np.trace(matrix) / max(matrix.sum(), 1))}


def summary(rows, test, report, ctx, *, fit_seconds: float, wall_seconds: float,
            profile: dict) -> dict:
    """reports/train.json: test scores, the best epoch, speed and placement."""
    # Steady state: the first epoch of a process also traces and compiles.
    fresh = [r["images_per_s"] for r in rows if r["epoch"] > ctx.done]
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
        "resumed_after_epoch": ctx.done,
        "wall_seconds": round(wall_seconds, 2),
        "fit_seconds": round(fit_seconds, 2),
        "images_per_s": round(statistics.median(steady), 1) if steady else 0.0,
        "replicas": ctx.placement["replicas"],
        "global_batch_size": ctx.global_batch,
        **{k: round(v, 6) for k, v in profile.items()},
    }
